"""Every GET of the REST API refuses a query parameter it does not know (claw_kit/web/query.py).

The endpoints come from the URL confs (gateway/urls.py and curation/api_urls.py, under
/api/v1/ in claw_site/urls.py), so a new endpoint is covered without touching this file: with
an unknown parameter it answers 400 in the API's error shape naming it, with each parameter
its OpenAPI operation lists it does not answer 400, and the schema lists exactly what it
accepts (DRF's ``format`` aside, which every endpoint takes).
"""

from __future__ import annotations

import uuid
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from claw_kit.web.query import known_query_params
from pool.models import Scope
from tests.conftest import client_for

API_PREFIX = "api/v1/"
# The schema and its viewer are drf-spectacular's own views (their own parameters: format,
# lang), not endpoints of the API.
NOT_ENDPOINTS = (SpectacularAPIView, SpectacularSwaggerSplitView)
# A value for each URL keyword of the API's routes (a missing object is a 404, which is
# enough: the query is checked before the handler runs). A new keyword fails loudly below.
PATH_VALUES = {
    "uid": "no-such-uid",
    "name": "no-such-name",
    "lease_id": str(uuid.UUID(int=1)),
    "snapshot_id": str(uuid.UUID(int=2)),
    "sha256": "0" * 64,
    "version": "1",
}
UNKNOWN = "no_such_parameter"


def api_get_routes() -> list[tuple[str, str, type]]:
    """(route name, URL, view class) of every GET of a DRF view under /api/v1/."""
    out: list[tuple[str, str, type]] = []

    def walk(patterns, prefix: str, namespace: str | None) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern), p.namespace or namespace)
            elif isinstance(p, URLPattern):
                cls = getattr(p.callback, "cls", None)
                route = prefix + str(p.pattern)
                if not (route.lstrip("^").startswith(API_PREFIX) and cls and issubclass(cls, APIView)):
                    continue
                if issubclass(cls, NOT_ENDPOINTS) or not hasattr(cls, "get"):
                    continue
                keywords = list(p.pattern.regex.groupindex)
                missing = [k for k in keywords if k not in PATH_VALUES]
                assert not missing, f"route {p.name}: give PATH_VALUES a value for {missing}"
                url = reverse(f"{namespace}:{p.name}", kwargs={k: PATH_VALUES[k] for k in keywords})
                out.append((p.name, url, cls))

    walk(get_resolver().url_patterns, "", None)
    return out


ROUTES = api_get_routes()


def test_the_walk_finds_the_api_list_endpoints():
    names = {name for name, _, _ in ROUTES}
    lists = {"steps", "trajectories", "groups", "events", "feedback", "policy-versions", "tasks"}
    assert lists | {"datasets", "task-sampler-records", "consumer-detail", "snapshot-download"} <= names


@pytest.fixture
def admin(make_key):
    return client_for(make_key(Scope.ADMIN, name="q-admin"))


@pytest.fixture
def schema_params(admin) -> dict[type, dict[str, dict]]:
    """Each GET operation's query parameters in the API's schema, by view class."""
    schema = admin.get("/api/v1/schema/", {"format": "json"}).json()
    out: dict[type, dict[str, dict]] = {}
    for path, ops in schema["paths"].items():
        if "get" not in ops or not path.startswith("/" + API_PREFIX):
            continue
        url = path
        for k, v in PATH_VALUES.items():
            url = url.replace("{" + k + "}", v)
        cls = resolve(url).func.cls
        out[cls] = {p["name"]: p for p in ops["get"].get("parameters", []) if p["in"] == "query"}
    return out


@pytest.fixture
def two_tasks(admin):
    """Two tasks, so that the tasks list has a next page and a real cursor to follow."""
    body = {"tasks": [{"uid": f"q-{i}", "set": "q", "prompt": f"p{i}"} for i in range(2)]}
    assert admin.post("/api/v1/tasks", body, format="json").status_code == 201


def a_value(admin, url: str, name: str, param: dict) -> str:
    """A well-formed value for a documented parameter, from its schema."""
    schema = param.get("schema", {})
    if name == "cursor":  # a real one: the next page's
        nxt = admin.get(url, {"page_size": 1}).json().get("next")
        return parse_qs(urlparse(nxt).query)["cursor"][0] if nxt else "x"
    if schema.get("enum"):
        return str(schema["enum"][0])
    if schema.get("format") == "date-time":
        return "2026-01-01T00:00:00Z"
    return {"integer": "1", "number": "0.5", "boolean": "true"}.get(schema.get("type"), "x")


@pytest.mark.parametrize(("name", "url", "cls"), ROUTES, ids=[r[0] for r in ROUTES])
def test_every_get_refuses_an_unknown_parameter_and_takes_each_documented_one(
    admin, schema_params, two_tasks, name, url, cls
):
    # given an endpoint of the URL conf, documented in the schema
    assert cls in schema_params, f"{name}: no GET operation in the schema"
    documented = schema_params[cls]
    # when it is asked with a parameter it does not know
    resp = admin.get(f"{url}?{urlencode({UNKNOWN: 'x'})}")
    # then it is a 400 in the API's error shape, naming the parameter
    assert resp.status_code == 400, (name, resp.status_code, resp.content[:300])
    error = resp.json()["error"]
    assert error["param"] == UNKNOWN and UNKNOWN in error["message"], error
    assert (error["type"], error["code"]) == ("invalid_request_error", "unknown_parameter")
    # and each parameter the schema lists (and DRF's format) is taken
    query = {p: a_value(admin, url, p, spec) for p, spec in documented.items()}
    query.setdefault("format", "json")
    for p, value in query.items():
        resp = admin.get(url, {p: value})
        assert resp.status_code != 400, (name, p, value, resp.content[:300])
    # and what it accepts is exactly what the schema lists, with format
    view = cls()
    view.request, view.args, view.kwargs = Request(APIRequestFactory().get(url)), (), {}
    assert known_query_params(view, "GET") == set(documented) | {"format"}, name


def test_a_misspelt_filter_is_refused_not_ignored(admin):
    """The defect a user met: ?trajectory= (the filter is trajectory_uid) answered every row."""
    resp = admin.get("/api/v1/steps", {"trajectory": "X"})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "trajectory"
    assert "trajectory_uid" in resp.json()["error"]["message"]  # the message lists the known ones
    assert admin.head("/api/v1/steps?trajectory=X").status_code == 400
    assert admin.get("/api/v1/steps", {"trajectory_uid": "X"}).status_code == 200


def test_an_unknown_parameter_is_checked_after_authentication(make_key):
    # a caller without a key learns nothing but its 401
    assert client_for(None).get("/api/v1/steps", {"trajectory": "X"}).status_code == 401
    # and a key without the scope its 403
    ingest = client_for(make_key(Scope.INGEST, name="q-ingest"))
    assert ingest.get("/api/v1/consumers/c", {"trajectory": "X"}).status_code == 403
