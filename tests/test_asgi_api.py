"""The REST API's ASGI handler (claw_site/asgi_api.py) answers exactly as Django's stock
ASGIHandler does: the same status, headers (every middleware's: CSP, nosniff, framing,
referrer, opener policy, Vary) and body, for each kind of request in one table, while
running the whole synchronous chain in one call on one worker thread."""

from __future__ import annotations

import asyncio
import os
import threading

import orjson
import pytest
from django.core.handlers.asgi import ASGIHandler
from django.db import connections

from claw_site.asgi_api import SyncAPIHandler
from pool.models import Step
from pool.selectors.steps import steps_read

pytestmark = pytest.mark.django_db(transaction=True)

# Headers whose value may differ between two answers to the same request.
VOLATILE = {b"date", b"content-length"}


async def _serve(app, method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, dict, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path.split("?")[0],
        "raw_path": path.split("?")[0].encode(),
        "query_string": path.partition("?")[2].encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-length", str(len(body)).encode()), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }
    sent: list[dict] = []
    received = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if received:
            return received.pop(0)
        await asyncio.Event().wait()  # the client stays connected

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.lower(): v for k, v in start["headers"]}, content


async def _db(fn, *args, **kwargs):
    """``fn`` on a worker thread, its database connection closed after (no session left
    behind for the test database's teardown)."""

    def run():
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    return await asyncio.to_thread(run)


def _steps(tag: str) -> bytes:
    return orjson.dumps(
        {
            "steps": [
                {
                    "trajectory_uid": f"asgi-{tag}",
                    "step_index": 0,
                    "prompt_ids": [1, 2, 3],
                    "response_ids": [4, 5],
                    "rollout_logprobs": [-0.5, -0.25],
                    "reward": 0.75,
                    "is_last": True,
                }
            ]
        }
    )


# (name, method, path, body of the handler's own tag (None: no body), key?, content type, status)
CASES = [
    ("a new batch", "POST", "/api/v1/steps", _steps, True, b"application/json", 201),
    (
        "a bad batch",
        "POST",
        "/api/v1/steps",
        lambda tag: b'{"steps": [{"step_index": -1}]}',
        True,
        b"application/json",
        400,
    ),
    ("no key", "POST", "/api/v1/steps", _steps, False, b"application/json", 401),
    ("a read", "GET", "/api/v1/steps?trajectory_uid=nobody", None, True, None, 200),
    ("an unknown API path", "GET", "/api/v1/no-such-thing", None, True, None, 404),
    ("an unknown query parameter", "GET", "/api/v1/steps?limt=5", None, True, None, 400),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
async def test_the_api_handler_answers_as_djangos_own(case, make_key):
    name, method, path, body_of, keyed, ctype, expected = case
    key = await _db(make_key, "ingest", "read")
    headers = []
    if keyed:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    if ctype:
        headers.append((b"content-type", ctype))
    answers = {}
    for label, app in (("django", ASGIHandler()), ("api", SyncAPIHandler())):
        body = body_of(label) if body_of else b""
        answers[label] = await _serve(app, method, path, body, headers)
    (d_status, d_headers, d_body), (a_status, a_headers, a_body) = answers["django"], answers["api"]
    assert a_status == d_status == expected, (name, a_body, d_body)
    strip = lambda h: {k: v for k, v in h.items() if k not in VOLATILE}  # noqa: E731
    assert strip(a_headers) == strip(d_headers), name
    # the middleware chain ran: the headers Django's middlewares and the CSP add
    for header in (b"content-security-policy", b"x-content-type-options", b"x-frame-options"):
        assert header in a_headers, (name, header)
    assert a_body.replace(b"-api", b"-django") == d_body, name


async def test_a_batch_through_the_api_handler_is_stored_field_by_field(make_key):
    key = await _db(make_key, "ingest")
    status, _, body = await _serve(
        SyncAPIHandler(),
        "POST",
        "/api/v1/steps",
        _steps("stored"),
        [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")],
    )
    assert status == 201, body
    assert orjson.loads(body)["created"] == 1

    def read():
        return steps_read([Step.objects.get(trajectory__uid="asgi-stored").id]).rows[0]

    row = await _db(read)
    assert (row["trajectory_uid"], row["step_index"], row["is_last"], row["reward"]) == (
        "asgi-stored",
        0,
        True,
        0.75,
    )
    assert row["prompt_ids"].tolist() == [1, 2, 3] and row["response_ids"].tolist() == [4, 5]
    assert list(row["rollout_logprobs"]) == [-0.5, -0.25]


async def test_the_view_the_middlewares_and_the_signals_run_on_one_worker_thread(make_key, monkeypatch):
    """One hop: request_started, every middleware, the view and request_finished (the
    database connection's release) on the same thread, not the event loop's."""
    from django.core import signals

    key = await _db(make_key, "read")
    seen: list[tuple[str, int]] = []

    def started(**kwargs):
        seen.append(("started", threading.get_ident()))

    def finished(**kwargs):
        seen.append(("finished", threading.get_ident()))

    from rest_framework.views import APIView

    original = APIView.dispatch

    def dispatch(self, request, *args, **kwargs):
        seen.append(("view", threading.get_ident()))
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(APIView, "dispatch", dispatch)
    signals.request_started.connect(started)
    signals.request_finished.connect(finished)
    try:
        status, _, _ = await _serve(
            SyncAPIHandler(), "GET", "/api/v1/steps", headers=[(b"authorization", f"Bearer {key}".encode())]
        )
    finally:
        signals.request_started.disconnect(started)
        signals.request_finished.disconnect(finished)
    assert status == 200
    assert [what for what, _ in seen] == ["started", "view", "finished"]
    assert len({thread for _, thread in seen}) == 1
    assert seen[0][1] != threading.get_ident()


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="needs PostgreSQL: on SQLite these concurrent long-polls answer 503 (database_unavailable)",
)
async def test_trainers_long_polling_do_not_hold_up_other_api_requests(make_key, monkeypatch):
    """A long-poll pull sleeps on its worker thread until its deadline. More of them than
    the event loop's default pool has threads (cores + 4) must leave room for other API
    requests: a read is answered while every long-poll is still waiting."""
    import os

    from curation.services.datasets import dataset_create
    from pool.models import Scope

    await _db(dataset_create, name="empty")
    trainer = await _db(make_key, Scope.CONSUME)
    reader = await _db(make_key, Scope.READ)
    handler = SyncAPIHandler()

    def poll(wait: int):
        return _serve(
            handler,
            "POST",
            "/api/v1/consumers/waiting/pull",
            orjson.dumps({"dataset": "empty", "wait": wait}),
            [(b"authorization", f"Bearer {trainer}".encode()), (b"content-type", b"application/json")],
        )

    assert (await poll(0))[0] == 200  # the consumer exists before the long-polls
    # Which threads are sleeping in a long-poll (curation/apis.py sleeps between re-checks).
    import time

    import curation.apis as apis

    sleepers: set[int] = set()

    class _Time:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds: float) -> None:
            sleepers.add(threading.get_ident())
            time.sleep(seconds)

    monkeypatch.setattr(apis, "time", _Time)
    n = (os.cpu_count() or 1) + 6
    polls = [asyncio.ensure_future(poll(10)) for _ in range(n)]
    deadline = time.monotonic() + 60
    while len(sleepers) < n:  # every long-poll waiting, each on a thread of its own
        assert time.monotonic() < deadline, f"{len(sleepers)} of {n} long-polls got a thread"
        await asyncio.sleep(0.02)
    status, _, _ = await _serve(
        handler, "GET", "/api/v1/steps", headers=[(b"authorization", f"Bearer {reader}".encode())]
    )
    assert status == 200
    assert not any(p.done() for p in polls)  # answered while every trainer still waited
    for status, _, body in await asyncio.gather(*polls):
        assert status == 200, body
        assert orjson.loads(body)["lease_id"] is None, body
