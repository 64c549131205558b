"""The site's URL conf with routes that raise (tests/hostile/test_error_pages.py): an
unhandled error on an API path, a gateway door's path and a page."""

from django.urls import path

from claw_site.urls import handler404, handler500  # noqa: F401 - the handlers under test
from claw_site.urls import urlpatterns as site_patterns


def boom(request, **kwargs):
    raise RuntimeError("boom: DATABASE_URL=postgres://claw:s3cret@db/claw")


urlpatterns = [
    path("api/v1/boom", boom),
    path("v1/boom", boom),
    path("t/a/b/v1/messages", boom),
    path("boom/", boom),
    *site_patterns,
]
