"""The URLconf of the lean gateway handler (gateway/proxy/asgi.py): only the gateway's own
routes, mounted where claw_site/urls.py mounts them, so resolving a proxied call does not
walk the whole site's patterns first."""

from django.urls import include, path

# An unhandled error on a gateway path: a JSON 500 in the door's shape (claw_site/ops.py).
handler500 = "claw_site.ops.server_error"

urlpatterns = [
    path("", include("gateway.proxy.urls")),
    path("compat/claw-r1/", include("gateway.compat.urls")),
]
