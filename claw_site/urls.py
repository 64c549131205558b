from django.contrib import admin
from django.urls import include, path

from gateway.apis import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("api/v1/", include("gateway.urls")),
    path("admin/", admin.site.urls),
    path("", include("curation.urls")),
]
