"""ASGI entry point: HTTP through Django (static files served in-process, no CDN; gateway
paths through a lean handler, the REST API through the synchronous chain in one thread hop:
claw_site/asgi_api.py), websockets through Channels; every body within
CLAW_MAX_BODY_BYTES."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "claw_site.settings.local")

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from claw_kit.web.body_limit import BodyLimitMiddleware  # noqa: E402
from claw_site.asgi_api import with_api  # noqa: E402
from claw_site.requestlog import RequestLogMiddleware  # noqa: E402
from claw_site.url_guard import UrlGuardMiddleware  # noqa: E402
from curation.routing import websocket_urlpatterns  # noqa: E402
from gateway.proxy.asgi import with_gateway  # noqa: E402

application = ProtocolTypeRouter(
    {
        # The OpenAI-compatible gateway paths (/v1/, /t/, /compat/claw-r1/) skip Django's
        # middleware chain (see gateway/proxy/asgi.py); everything else is plain Django. Every
        # URL passes the identifier rule first (claw_site/url_guard.py). The REST API (/api/)
        # runs Django's synchronous middleware chain in one thread hop (claw_site/asgi_api.py).
        "http": RequestLogMiddleware(
            UrlGuardMiddleware(
                BodyLimitMiddleware(with_gateway(with_api(ASGIStaticFilesHandler(django_asgi_app))))
            )
        ),
        "websocket": UrlGuardMiddleware(
            AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
        ),
    }
)

# The cyclic garbage collector, set for a server process. A proxied call allocates ~150
# containers (the parsed request and answer: per-token logprob entries, id lists), so with
# the default thresholds (700, 10, 10) a young collection ran every few calls and a full one
# every few seconds over the ~110k objects the imports left (~60 ms each); py-spy put ~17%
# of the gateway's GIL time in gc_collect_main under bench.proxy's c=32 load. What exists
# now (modules, classes, settings, URL patterns) lives as long as the process: frozen, no
# collection scans it again, and the young generation is collected every 20k allocations.
# Reference counting still frees everything that is not a cycle at once.
gc.freeze()
gc.set_threshold(20_000, 20, 20)
