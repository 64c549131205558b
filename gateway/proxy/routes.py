"""The URLconf of the lean gateway handler (gateway/proxy/asgi.py): only the gateway's own
routes, mounted where claw_site/urls.py mounts them, so resolving a proxied call does not
walk the whole site's patterns first."""

from django.urls import include, path

urlpatterns = [
    path("", include("gateway.proxy.urls")),
    path("compat/claw-r1/", include("gateway.compat.urls")),
]
