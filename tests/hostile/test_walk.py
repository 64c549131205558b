"""A walk over every URL pattern of the site and every body field of the main write
endpoints, with the characters no identifier may hold.

1. Every URL pattern of the URL conf (``get_resolver()``, recursively), each of its arguments
   in turn holding NUL, CRLF or U+2028 (the others valid), and a query value holding each,
   for GET and the pattern's write methods, with an admin key (every scope) and with an
   ingest key, through the ASGI application ``serve`` runs (claw_site/asgi.py): a 400 in the
   door's shape naming the argument, and no row written anywhere.
2. Every body field of the main write endpoints holding a NUL string, through the REST API:
   a 4xx JSON error naming the field, and no row written.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
import pytest
from django.test import Client
from django.urls import Resolver404, URLPattern, URLResolver, get_resolver, resolve

from curation.models import Consumer, Dataset, DatasetVersion, LabelEvent, Lease, Snapshot
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.models import ApiKey, AuditEvent, Media, MergeResult, Scope
from pool.services.api_keys import api_key_create
from tests.pool.factories import pool_counts, step_in

BAD = {"NUL": "a\x00b", "CRLF": "a\r\nX-Evil: 1", "U+2028": "a\u2028b"}
BAD_CHARS = {"\x00", "\r", "\n", "\u2028"}
WRITE_METHODS = ("post", "put", "patch", "delete")
ANTHROPIC_SUFFIXES = ("/v1/messages", "/v1/messages/count_tokens")
UUID = "00000000-0000-4000-8000-000000000000"


def every_count() -> dict[str, int]:
    models = (Dataset, DatasetVersion, LabelEvent, Lease, Snapshot, Consumer, ApiKey, AuditEvent, MergeResult)
    return {**pool_counts(), **{m.__name__: m.objects.count() for m in (*models, Media)}}


# --- the URL conf's patterns ---------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    template: str  # "/api/v1/datasets/{name}": each argument a {placeholder}
    args: tuple[str, ...]
    methods: tuple[str, ...]  # "get" and the view's write methods


def routes() -> list[Route]:
    """Every URLPattern of the root URL conf, as a path template with its arguments."""
    out: list[Route] = []

    def walk(patterns: list, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                template = "/" + _template(prefix + str(p.pattern))
                args = tuple(re.findall(r"\{(\w+)\}", template))
                out.append(Route(template, args, ("get", *_write_methods(p.callback))))

    walk(get_resolver().url_patterns, "")
    return out


def _template(raw: str) -> str:
    """A route or regex as a path with ``{name}`` for each argument and a plain segment for
    any other regex part (an optional prefix is left out; ``[kc]`` is ``k``)."""
    path = raw.replace("^", "").replace("$", "")
    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", path)
    path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", path)
    path = re.sub(r"\(\?:[^)]*\)\?", "", path)
    path = re.sub(r"\[(\w)\w*\]", r"\1", path)
    return path.replace(".*", "x")


def _write_methods(callback: Any) -> tuple[str, ...]:
    view = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view is None:  # a function view (the gateway's doors, the admin's): it may take POST
        return ("post",)
    return tuple(m for m in WRITE_METHODS if hasattr(view, m))


@dataclass(frozen=True)
class UrlCase:
    id: str
    method: str
    path: str  # decoded, as ASGI gives it
    query: bytes
    param: str  # the argument or query parameter the error must name
    caller: str  # "admin" or "ingest"


def url_cases() -> Iterator[UrlCase]:
    for route in routes():
        for method in route.methods:
            for caller in ("admin", "ingest"):
                for what, bad in BAD.items():
                    valid = _fill(route, {})
                    for arg in route.args:
                        yield UrlCase(
                            f"{method} {route.template} {arg}={what} as {caller}",
                            method,
                            _fill(route, {arg: bad}),
                            b"",
                            arg,
                            caller,
                        )
                    yield UrlCase(
                        f"{method} {route.template} ?q={what} as {caller}",
                        method,
                        valid,
                        b"q=" + quote(bad).encode(),
                        "q",
                        caller,
                    )


def _fill(route: Route, values: dict[str, str]) -> str:
    filled = route.template
    for arg in route.args:
        default = UUID if "id" in arg else "ok"
        filled = filled.replace("{" + arg + "}", values.get(arg, default))
    return filled


async def asgi_request(
    method: str, path: str, query: bytes, key: str
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through the project's ASGI application, as uvicorn hands it over."""
    from claw_site.asgi import application

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method.upper(),
        "scheme": "http",
        "path": path,
        "raw_path": quote(path).encode(),
        "query_string": query,
        "root_path": "",
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    received = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict:
        if received:
            return received.pop(0)
        await asyncio.Event().wait()  # connected until the server is done
        return {}

    async def send(message: dict) -> None:
        sent.append(message)

    await application(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.lower(): v for k, v in start["headers"]}, body


URL_CASES = list(url_cases())


def test_the_walk_covers_every_pattern_and_argument():
    # every pattern is walked (query values on each), and each argument of each
    every = routes()
    assert len(every) > 250
    assert sum(len(r.args) for r in every) > 150
    walked = {(c.path.split("?")[0], c.param) for c in URL_CASES}
    assert len(URL_CASES) >= 3 * 2 * (len(every) + sum(len(r.args) for r in every))
    for route in every:
        assert (_fill(route, {}), "q") in walked, route
    print(f"url walk: {len(URL_CASES)} cases over {len(every)} patterns")  # the report's figure


@pytest.mark.django_db(transaction=True)
def test_every_url_argument_and_query_value_refuses_what_no_identifier_holds():
    # given a seeded pool, an admin key (every scope) and an ingest key
    steps_ingest(steps=[step_in("walk-t", 0, prompt=[1, 2], response=[3], group="walk-g")])
    dataset_create(name="walk-ds")
    keys = {
        "admin": api_key_create(name="walk-admin", scopes=[Scope.ADMIN])[1],
        "ingest": api_key_create(name="walk-ingest", scopes=[Scope.INGEST])[1],
    }
    before = every_count()
    failures: list[str] = []

    async def walk() -> None:
        for case in URL_CASES:
            # when the request is sent
            status, headers, body = await asgi_request(case.method, case.path, case.query, keys[case.caller])
            # then a 400 in the door's shape naming the argument
            problem = _shape_problem(case, status, headers, body)
            if problem:
                failures.append(f"{case.id!a}: {problem}")

    asyncio.run(walk())
    assert not failures, f"{len(failures)} of {len(URL_CASES)} failed:\n" + "\n".join(failures[:40])
    # and no row was written anywhere
    assert every_count() == before


def _shape_problem(case: UrlCase, status: int, headers: dict[bytes, bytes], body: bytes) -> str | None:
    if status != 400:
        return f"status {status}: {body[:200]!r}"
    if not headers.get(b"content-type", b"").startswith(b"application/json"):
        return f"content-type {headers.get(b'content-type')!r}"
    answer = orjson.loads(body)
    if case.path.endswith(ANTHROPIC_SUFFIXES):
        if answer.get("type") != "error" or set(answer["error"]) != {"type", "message"}:
            return f"not Anthropic's shape: {answer}"
        return None if answer["error"]["message"] else "no message"
    error = answer.get("error", {})
    if set(error) != {"type", "code", "message", "param"}:
        return f"not the API's shape: {answer}"
    if error["type"] != "invalid_request_error" or not error["message"]:
        return f"type/message: {error}"
    expected = case.param if case.param == "q" else _matched_argument(case.path, case.param)
    if error["param"] != expected:
        return f"param {error['param']!r}, expected {expected!r}"
    return None


def _matched_argument(path: str, arg: str) -> str:
    """The argument the error names: ``arg`` where the path still matches its route; where
    the bad value does not fit (a uuid) and another route matches the path (the admin's
    catch-all), that route's argument holding it; ``path`` where no route matches."""
    try:
        match = resolve(path)
    except Resolver404:
        return "path"
    held = [name for name, value in match.kwargs.items() if isinstance(value, str) and set(value) & BAD_CHARS]
    return arg if arg in held else (held[0] if held else "path")


@pytest.mark.django_db(transaction=True)
def test_a_path_argument_is_named_by_its_routes_name():
    # given routes whose argument a bad character still matches
    key = api_key_create(name="walk-named", scopes=[Scope.ADMIN])[1]
    for path, param in [
        ("/api/v1/steps/a\x00b", "uid"),
        ("/api/v1/trajectories/a\u2028b/complete", "uid"),
        ("/api/v1/datasets/a\r\nb/preview", "name"),
        ("/api/v1/consumers/a\u202eb/pull", "name"),
        ("/t/ok/a\u200bb/v1/chat/completions", "prompt_group_uid"),
        ("/compat/claw-r1/complete_trajectory/a\ufeffb", "trajectory_uid"),
        ("/trajectories/a\x00b/", "uid"),
    ]:
        # when one is requested, then the 400 names the route's argument
        status, _, body = asyncio.run(asgi_request("get", path, b"", key))
        assert status == 400, (path, body)
        assert orjson.loads(body)["error"]["param"] == param, (path, body)
    # and a query value, percent-escaped or raw (a raw control byte skips no check), by its name
    for query, param in [
        (b"trajectory_uid=a%00b", "trajectory_uid"),
        (b"cursor=x&trajectory_uid=a\tb", "trajectory_uid"),
        (b"trajectory_uid=a%E2%80%AEb", "trajectory_uid"),
        (b"a%0Db=1", "query"),
    ]:
        status, _, body = asyncio.run(asgi_request("get", "/api/v1/steps", query, key))
        assert status == 400, (query, body)
        assert orjson.loads(body)["error"]["param"] == param, (query, body)


@pytest.mark.django_db(transaction=True)
def test_valid_unicode_in_a_path_and_a_query_is_not_refused():
    # given a trajectory whose uid is non-ASCII but holds no refused character
    steps_ingest(steps=[step_in("walk-é漢🙂", 0, prompt=[1], response=[2])])
    key = api_key_create(name="walk-unicode", scopes=[Scope.ADMIN])[1]
    # when it is read by path and filtered by query, then both answer it
    status, _, body = asyncio.run(asgi_request("get", "/api/v1/trajectories/walk-é漢🙂", b"", key))
    assert status == 200, body
    assert orjson.loads(body)["uid"] == "walk-é漢🙂"
    query = b"trajectory_uid=" + quote("walk-é漢🙂").encode()
    status, _, body = asyncio.run(asgi_request("get", "/api/v1/steps", query, key))
    assert status == 200, body
    assert [s["trajectory_uid"] for s in orjson.loads(body)["results"]] == ["walk-é漢🙂"]


# --- every body field of the main write endpoints ------------------------------------------------
A = "/api/v1"
STEP = {
    "uid": "walk-body-s",
    "trajectory_uid": "walk-body-t",
    "prompt_group_uid": "walk-body-g",
    "step_index": 0,
    "prompt_ids": [1, 2],
    "response_ids": [3],
    "rollout_logprobs": [-0.5],
    "response_text": "r",
    "messages": [{"role": "user", "content": "hi"}],
    "reward": 1.0,
    "finish_reason": "stop",
    "metadata": {"k": "v"},
}
# (endpoint, a valid body): each field (leaf) in turn replaced by a NUL string.
WRITES: list[tuple[str, dict[str, Any]]] = [
    (f"{A}/steps", {"steps": [STEP]}),
    (f"{A}/trajectories", {"uid": "walk-body-t2", "prompt_group_uid": "walk-body-g", "metadata": {"k": "v"}}),
    (
        f"{A}/groups",
        {"uid": "walk-body-g2", "task": "t", "dataset": "d", "ground_truth": "42", "metadata": {"k": "v"}},
    ),
    (f"{A}/rewards", {"step_uid": "walk-seed:0", "reward": 0.5, "source": "env", "metadata": {"k": "v"}}),
    (f"{A}/events", {"type": "tool_call", "trajectory_uid": "walk-seed", "payload": {"k": "v"}}),
    (
        f"{A}/feedback",
        {
            "step_uid": "walk-seed:0",
            "rating": 1.0,
            "label": "good",
            "comment": "c",
            "correction": "x",
            "author": "a",
        },
    ),
    (f"{A}/datasets", {"name": "walk-body-ds2", "description": "d"}),
    (f"{A}/labels", {"step_uids": ["walk-seed:0"], "label": "accepted", "note": "n", "tags_add": ["t"]}),
    (f"{A}/consumers/walk-c/pull", {"dataset": "walk-body-ds", "batch_size": 1}),
    (f"{A}/snapshots", {"dataset": "walk-body-ds"}),
    (f"{A}/policy-versions", {"version": 7, "metadata": {"k": "v"}}),
    (f"{A}/trajectory-completions", {"completions": [{"uid": "walk-seed", "reward": 1.0}]}),
]


def leaves(value: Any, path: tuple = ()) -> Iterator[tuple]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, (*path, k))
    elif isinstance(value, list) and value and not all(isinstance(v, int) for v in value):
        for i, v in enumerate(value):
            yield from leaves(v, (*path, i))
    else:
        yield path


def replaced(body: Any, path: tuple, new: Any) -> Any:
    body = json.loads(json.dumps(body))
    node = body
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return body


BODY_CASES = [
    (f"{endpoint} {'.'.join(map(str, at))}", endpoint, body, at)
    for endpoint, body in WRITES
    for at in leaves(body)
]


@pytest.fixture
def seeded_body(db, settings, tmp_path) -> Client:
    settings.MEDIA_ROOT = tmp_path / "media"
    steps_ingest(steps=[step_in("walk-seed", 0, prompt=[1, 2], response=[3], group="walk-body-g")])
    dataset_create(name="walk-body-ds")
    key = api_key_create(name="walk-body", scopes=[Scope.ADMIN])[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


def test_the_walks_valid_bodies_are_accepted(seeded_body):
    # so what each case below refuses is its NUL, nothing else
    for endpoint, body in WRITES:
        resp = seeded_body.post(endpoint, data=json.dumps(body), content_type="application/json")
        assert 200 <= resp.status_code < 300, (endpoint, resp.status_code, resp.content[:300])


@pytest.mark.parametrize(("case", "endpoint", "body", "at"), BODY_CASES, ids=[c[0] for c in BODY_CASES])
def test_a_nul_in_any_body_field_is_a_4xx_naming_it(seeded_body, case, endpoint, body, at):
    # given the valid body with one field holding a NUL string
    before = every_count()
    hostile = replaced(body, at, "a\x00b")
    # when it is posted
    resp = seeded_body.post(endpoint, data=json.dumps(hostile), content_type="application/json")
    # then a 4xx JSON error naming the field, and nothing written
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:300])
    error = resp.json()["error"]
    assert error["message"]
    leaf = [p for p in at if not isinstance(p, int)]
    assert error["param"] is not None and str(leaf[-1]) in error["param"], (error, at)
    assert every_count() == before


# The identifier fields of those bodies (uids, names, types, labels, tags): a bidi control in
# each is a 4xx naming it too (the free-text fields, descriptions, notes and comments, may hold one).
IDENT_LEAVES = {
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_uid",
    "name",
    "dataset",
    "type",
    "task",
    "label",
}
IDENT_CASES = [
    (case, endpoint, body, at)
    for case, endpoint, body, at in BODY_CASES
    if [p for p in at if not isinstance(p, int)][-1] in IDENT_LEAVES or at[0] in ("step_uids", "tags_add")
]


@pytest.mark.parametrize(("case", "endpoint", "body", "at"), IDENT_CASES, ids=[c[0] for c in IDENT_CASES])
def test_a_bidi_control_in_an_identifier_field_is_a_4xx_naming_it(seeded_body, case, endpoint, body, at):
    # given the valid body with one identifier holding U+202E
    before = every_count()
    hostile = replaced(body, at, "a\u202eb")
    # when it is posted
    resp = seeded_body.post(endpoint, data=json.dumps(hostile), content_type="application/json")
    # then a 4xx JSON error naming the field, and nothing written
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:300])
    error = resp.json()["error"]
    leaf = [p for p in at if not isinstance(p, int)]
    assert error["param"] is not None and str(leaf[-1]) in error["param"], (error, at)
    assert every_count() == before
