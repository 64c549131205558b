"""ASGI entry point: HTTP through Django (static files served in-process, no CDN; gateway
paths through a lean handler), websockets through Channels; every body within
CLAW_MAX_BODY_BYTES."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "claw_site.settings.local")

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from claw_kit.web.body_limit import BodyLimitMiddleware  # noqa: E402
from claw_site.requestlog import RequestLogMiddleware  # noqa: E402
from curation.routing import websocket_urlpatterns  # noqa: E402
from gateway.proxy.asgi import with_gateway  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The OpenAI-compatible gateway paths (/v1/, /t/, /compat/claw-r1/) skip Django's
        # middleware chain (see gateway/proxy/asgi.py); everything else is plain Django.
        "http": RequestLogMiddleware(
            BodyLimitMiddleware(with_gateway(ASGIStaticFilesHandler(django_asgi_app)))
        ),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
