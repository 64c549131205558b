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

# Each door once: (its path under a base URL, its view, its route name). The three base URLs
# (plain, scoped, capability) give each door its three routes.
DOORS = [
    ("chat/completions", views.chat_completions, "chat_completions"),
    ("completions", views.completions, "completions"),
    ("models", views.models, "models"),
    ("messages", anthropic.messages, "messages"),
    ("messages/count_tokens", anthropic.count_tokens, "count_tokens"),
    ("responses", responses.responses, "responses"),
]
BASES = [("v1/", ""), (_SCOPED, "scoped_"), (_CAPABILITY, "capability_")]

urlpatterns = [
    *(path(base + route, view, name=prefix + name) for base, prefix in BASES for route, view, name in DOORS),
    # Anything else under a gateway base URL: an OpenAI-shaped 404, not an HTML page.
    re_path(r"^(?:t/[^/]+/[^/]+/)?v1/", views.unknown_endpoint, name="unknown"),
    re_path(r"^t/c/", views.unknown_endpoint, name="capability_unknown"),
]
