from django.urls import path

from . import views

app_name = "curation"

urlpatterns = [
    path("", views.home, name="home"),
]
