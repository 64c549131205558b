"""The admin site: Django's, except for whom it refuses.

A signed-in user without admin access (a reviewer) who opens any admin page gets the site's
403 page (templates/403.html: who they are, what role it needs, a way on), at once, not a
redirect to Django's admin sign-in form asking them to sign in as someone else. Anonymous
visitors still get the sign-in form.
"""

from __future__ import annotations

import functools
from typing import Any

from django.contrib.admin import AdminSite
from django.contrib.admin.apps import AdminConfig
from django.core.exceptions import PermissionDenied

REFUSAL = "the admin needs the operator or admin role"


class ClawAdminSite(AdminSite):
    def _refuse_signed_in_without_access(self, request: Any) -> None:
        if request.user.is_authenticated and not self.has_permission(request):
            raise PermissionDenied(REFUSAL)

    def admin_view(self, view: Any, cacheable: bool = False) -> Any:
        wrapped = super().admin_view(view, cacheable)

        @functools.wraps(wrapped)
        def inner(request: Any, *args: Any, **kwargs: Any) -> Any:
            if view.__name__ != "logout":  # signing out stays open to everyone signed in
                self._refuse_signed_in_without_access(request)
            return wrapped(request, *args, **kwargs)

        return inner

    def login(self, request: Any, extra_context: dict[str, Any] | None = None) -> Any:
        self._refuse_signed_in_without_access(request)
        return super().login(request, extra_context)


class ClawAdminConfig(AdminConfig):
    default_site = "claw_site.admin_site.ClawAdminSite"
