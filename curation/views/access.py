"""Who may see a page: the permissions the pages ask for (curation/roles.py gives each role its
set), the decorator that asks, and the sign-in and sign-out views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

VIEW = "pool.view_trajectory"


REVIEW = "pool.add_feedback"


CURATE = "pool.change_step"


GROUPS = "pool.view_promptgroup"


def allowed(perm: str) -> Callable:
    """Signed in (else redirect to /login/) and holding ``perm`` (else 403)."""

    def decorate(view: Callable) -> Callable:
        return login_required(permission_required(perm, raise_exception=True)(view))

    return decorate


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied


login = auth_views.LoginView.as_view(template_name="curation/login.html", redirect_authenticated_user=True)


logout = auth_views.LogoutView.as_view()


def _wants_html(request: HttpRequest) -> bool:
    """A page, not JSON: ?format=html, or a browser's Accept naming text/html before (or
    instead of) JSON; ?format=json always JSON."""
    fmt = request.GET.get("format")
    if fmt in ("json", "html"):
        return fmt == "html"
    accept = request.headers.get("Accept", "")
    html, js = accept.find("text/html"), accept.find("application/json")
    return html >= 0 and (js < 0 or html < js)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
