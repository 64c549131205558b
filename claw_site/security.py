"""Content-Security-Policy on every page Django renders (the gateway's JSON paths skip the
middleware chain and need none).

The policy allows scripts, styles, images, fonts and connections (fetch, websockets) from the
site itself only: no inline script or style, no eval, no framing, no plugins. The pages comply:
each loads one static script (templates/, claw_site/static/claw/), and the API docs page loads
Swagger UI's script and styles as files (templates/drf_spectacular/swagger_ui.html).
Django's SecurityMiddleware and XFrameOptionsMiddleware add the other headers
(settings.base, "Security").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


class ContentSecurityPolicyMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]):
        self.get_response = get_response
        self.policy = settings.CLAW_CONTENT_SECURITY_POLICY
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        return self._add(self.get_response(request))

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._add(await self.get_response(request))

    def _add(self, response: HttpResponse) -> HttpResponse:
        if self.policy and HEADER not in response:
            response[HEADER] = self.policy
        return response
