"""OpenAI-compatible routes (and the Anthropic Messages and OpenAI Responses doors,
gateway/proxy/doors/): ``/v1/...``, the scoped base URL ``/t/<trajectory>/<group>/v1/...``
(``-`` as the group means none) and the capability URL ``/t/c/<token>/<trajectory>/<group>/v1/...``
(POST /api/v1/trajectories returns it: the token alone authorises, for that trajectory only)."""

from django.urls import path, re_path

from . import views
from .doors import anthropic, responses

app_name = "proxy"

_SCOPED = "t/<str:trajectory_uid>/<str:prompt_group_uid>/v1/"
_CAPABILITY = "t/c/<str:capability>/<str:trajectory_uid>/<str:prompt_group_uid>/v1/"

urlpatterns = [
    path("v1/chat/completions", views.chat_completions, name="chat_completions"),
    path("v1/completions", views.completions, name="completions"),
    path("v1/models", views.models, name="models"),
    path("v1/messages", anthropic.messages, name="messages"),
    path("v1/messages/count_tokens", anthropic.count_tokens, name="count_tokens"),
    path("v1/responses", responses.responses, name="responses"),
    path(_SCOPED + "chat/completions", views.chat_completions, name="scoped_chat_completions"),
    path(_SCOPED + "completions", views.completions, name="scoped_completions"),
    path(_SCOPED + "models", views.models, name="scoped_models"),
    path(_SCOPED + "messages", anthropic.messages, name="scoped_messages"),
    path(_SCOPED + "messages/count_tokens", anthropic.count_tokens, name="scoped_count_tokens"),
    path(_SCOPED + "responses", responses.responses, name="scoped_responses"),
    path(_CAPABILITY + "chat/completions", views.chat_completions, name="capability_chat_completions"),
    path(_CAPABILITY + "completions", views.completions, name="capability_completions"),
    path(_CAPABILITY + "models", views.models, name="capability_models"),
    path(_CAPABILITY + "messages", anthropic.messages, name="capability_messages"),
    path(_CAPABILITY + "messages/count_tokens", anthropic.count_tokens, name="capability_count_tokens"),
    path(_CAPABILITY + "responses", responses.responses, name="capability_responses"),
    # Anything else under a gateway base URL: an OpenAI-shaped 404, not an HTML page.
    re_path(r"^(?:t/[^/]+/[^/]+/)?v1/", views.unknown_endpoint, name="unknown"),
    re_path(r"^t/c/", views.unknown_endpoint, name="capability_unknown"),
]
