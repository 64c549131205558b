"""OpenAI-compatible routes: ``/v1/...`` and the scoped base URL ``/t/<trajectory>/<group>/v1/...``
(``-`` as the group means none)."""

from django.urls import path, re_path

from . import views

app_name = "proxy"

_SCOPED = "t/<str:trajectory_uid>/<str:prompt_group_uid>/v1/"

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat_completions"),
    path("v1/completions", views.completions, name="completions"),
    path("v1/models", views.models, name="models"),
    path(_SCOPED + "chat/completions", views.chat_completions, name="scoped_chat_completions"),
    path(_SCOPED + "completions", views.completions, name="scoped_completions"),
    path(_SCOPED + "models", views.models, name="scoped_models"),
    # Anything else under a gateway base URL: an OpenAI-shaped 404, not an HTML page.
    re_path(r"^(?:t/[^/]+/[^/]+/)?v1/", views.unknown_endpoint, name="unknown"),
]
