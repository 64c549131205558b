"""Claw-R1 protocol routes (mounted at /compat/claw-r1/); see gateway/compat/claw_r1.py."""

from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from ..proxy import views as proxy
from . import claw_r1

app_name = "claw_r1"

_BASE = "<str:trajectory_uid>/<str:prompt_uid>/v1/"


def _scoped(view):
    """The OpenAI views take the prompt group as ``prompt_group_uid``."""

    async def scoped(request, trajectory_uid: str, prompt_uid: str):
        return await view(request, trajectory_uid=trajectory_uid, prompt_group_uid=prompt_uid)

    return csrf_exempt(scoped)


urlpatterns = [
    path("init_trajectory", claw_r1.init_trajectory, name="init_trajectory"),
    path("submit_steps", claw_r1.submit_steps, name="submit_steps"),
    path("register_trajectory", claw_r1.register_trajectory, name="register_trajectory_body"),
    path(
        "complete_trajectory/<str:trajectory_uid>",
        claw_r1.complete_trajectory,
        name="complete_trajectory_uid",
    ),
    path(_BASE + "register_trajectory", claw_r1.register_trajectory, name="register_trajectory"),
    path(_BASE + "complete_trajectory", claw_r1.complete_trajectory, name="complete_trajectory"),
    path(_BASE + "trajectory/complete", claw_r1.complete_trajectory, name="trajectory_complete"),
    path(_BASE + "chat/completions", _scoped(proxy.chat_completions), name="chat_completions"),
    path(_BASE + "completions", _scoped(proxy.completions), name="completions"),
    path(_BASE + "models", _scoped(proxy.models), name="models"),
]
