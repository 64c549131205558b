"""What an error shows: an unhandled error is a JSON 500 in the door's shape on API and
gateway paths and the site's own page elsewhere, naming no setting, route or traceback; and
`make run`'s defaults (claw_site/settings/local.py) serve with DEBUG off, static files
included."""

from __future__ import annotations

import re

import httpx
import pytest
from django.test import Client

from tests.live import live_server

SECRETS = ("s3cret", "DATABASE_URL", "Traceback", "RuntimeError", "boom:", "urlpatterns", "INSTALLED_APPS")

# (path, content type, shape)
ERRORS = [
    ("/api/v1/boom", "application/json", "api"),
    ("/v1/boom", "application/json", "api"),
    ("/t/a/b/v1/messages", "application/json", "anthropic"),
    ("/boom/", "text/html", "page"),
]


@pytest.mark.django_db
@pytest.mark.urls("tests.hostile.boom_urls")
def test_an_unhandled_error_says_nothing_but_that_it_happened(settings):
    client = Client(raise_request_exception=False)
    for path, content_type, shape in ERRORS:
        # when a view raises (DEBUG off: the debug page is opt-in, DJANGO_DEBUG=1)
        resp = client.get(path)
        # then a 500 in the door's shape, and nothing of the error, the settings or the routes
        assert resp.status_code == 500, path
        assert resp["Content-Type"].startswith(content_type), (path, resp["Content-Type"])
        text = resp.content.decode()
        for secret in SECRETS:
            assert secret not in text, (path, secret)
        if shape == "api":
            assert resp.json() == {
                "error": {
                    "type": "api_error",
                    "code": "internal_error",
                    "message": "internal error; the server logged it",
                    "param": None,
                }
            }
        elif shape == "anthropic":
            assert resp.json() == {
                "type": "error",
                "error": {"type": "api_error", "message": "internal error; the server logged it"},
            }
        else:
            assert "data-server-error" in text and "Something went wrong" in text
            assert re.search(r'href="/static/claw/claw\.css"', text), text[:500]


@pytest.mark.live
def test_make_runs_defaults_serve_with_debug_off_and_static_files(tmp_path):
    # given the server as `make run` starts it (manage.py serve, local settings, DJANGO_DEBUG unset)
    with (
        live_server(tmp_path, {"DJANGO_DEBUG": ""}, serve=True) as server,
        httpx.Client(base_url=server.url, timeout=30) as http,
    ):
        # when an identifier holds a NUL, then a 400 naming it, no debug page
        resp = http.get("/api/v1/steps/a%00b")
        assert resp.status_code == 400, resp.text[:300]
        assert resp.json()["error"]["param"] == "uid"
        # when no route matches, then a JSON 404 listing no routes
        resp = http.get("/api/v1/no-such-route")
        assert resp.status_code == 404
        assert resp.json() == {
            "error": {
                "type": "not_found_error",
                "code": "not_found",
                "message": "no such endpoint: /api/v1/no-such-route",
                "param": None,
            }
        }
        resp = http.get("/no-such-page/")
        assert resp.status_code == 404
        assert "URLconf" not in resp.text and "api/v1/" not in resp.text
        # and the sign-in page loads with its stylesheet, and the pages' scripts are served
        page = http.get("/login/")
        assert page.status_code == 200
        css = re.search(r'href="(/static/[^"]+\.css)"', page.text)
        assert css is not None, page.text[:500]
        for asset, content_type in [
            (css.group(1), "text/css"),
            ("/static/claw/curation.js", "text/javascript"),
        ]:
            resp = http.get(asset)
            assert resp.status_code == 200, asset
            assert resp.headers["content-type"].startswith(content_type), (
                asset,
                resp.headers["content-type"],
            )
            assert len(resp.content) > 100


@pytest.mark.django_db
def test_an_unmatched_api_path_lists_no_routes_with_debug_on_too(settings):
    # given DEBUG on (DJANGO_DEBUG=1: Django's 404 page would list every route)
    settings.DEBUG = True
    for path in ("/api/v1/no-such-route", "/api/v2/steps", "/metrics/x"):
        # when no route matches, then the JSON 404, naming only the path
        resp = Client().get(path)
        assert resp.status_code == 404, path
        assert resp.json() == {
            "error": {
                "type": "not_found_error",
                "code": "not_found",
                "message": f"no such endpoint: {path}",
                "param": None,
            }
        }
