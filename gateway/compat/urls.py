"""Claw-R1 protocol routes (mounted at /compat/claw-r1/); see gateway/compat/claw_r1.py.

Three ways in, one set of views:

* ``c/<token>/<trajectory>/<prompt>/v1/...``: a capability URL (the token alone authorises,
  for its own trajectory only: register, complete, chat/completions, completions, models);
* ``k/<api key>/...``: a source's gateway URL (every endpoint, the ingest key in the path);
* the plain paths, with ``Authorization: Bearer <api key>``.
"""

from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from ..proxy import views as proxy
from ..proxy.doors import anthropic, responses
from . import claw_r1

app_name = "claw_r1"

_BASE = "<str:trajectory_uid>/<str:prompt_uid>/v1/"


def _scoped(view):
    """The OpenAI views take the prompt group as ``prompt_group_uid``."""

    async def scoped(request, trajectory_uid: str, prompt_uid: str, **credentials: str):
        return await view(request, trajectory_uid=trajectory_uid, prompt_group_uid=prompt_uid, **credentials)

    return csrf_exempt(scoped)


# Endpoints under a base URL (.../<trajectory>/<prompt>/v1/...).
_base = [
    (_BASE + "register_trajectory", claw_r1.register_trajectory, "register_trajectory"),
    (_BASE + "complete_trajectory", claw_r1.complete_trajectory, "complete_trajectory"),
    (_BASE + "trajectory/complete", claw_r1.complete_trajectory, "trajectory_complete"),
    (_BASE + "chat/completions", _scoped(proxy.chat_completions), "chat_completions"),
    (_BASE + "completions", _scoped(proxy.completions), "completions"),
    (_BASE + "models", _scoped(proxy.models), "models"),
    (_BASE + "messages", _scoped(anthropic.messages), "messages"),
    (_BASE + "messages/count_tokens", _scoped(anthropic.count_tokens), "count_tokens"),
    (_BASE + "responses", _scoped(responses.responses), "responses"),
]
# Endpoints that name no trajectory, or name it in the body or after the endpoint: never
# under a capability URL, which is scoped to its trajectory.
_entry = [
    ("init_trajectory", claw_r1.init_trajectory, "init_trajectory"),
    ("submit_steps", claw_r1.submit_steps, "submit_steps"),
    ("generate", claw_r1.generate, "generate"),
    ("compute_reward", claw_r1.compute_reward, "compute_reward"),
    ("register_trajectory", claw_r1.register_trajectory, "register_trajectory_body"),
    ("complete_trajectory/<str:trajectory_uid>", claw_r1.complete_trajectory, "complete_trajectory_uid"),
]

urlpatterns = [
    *(path("c/<str:capability>/" + route, view, name=f"capability_{name}") for route, view, name in _base),
    *(path("k/<str:api_key>/" + route, view, name=f"keyed_{name}") for route, view, name in _entry + _base),
    *(path(route, view, name=name) for route, view, name in _entry + _base),
    # Anything else under a gateway or capability URL: an OpenAI-shaped 404 that names the
    # path with its secret masked (never Django's debug page, which would print it).
    re_path(r"^[kc]/", proxy.unknown_endpoint, name="unknown"),
]
