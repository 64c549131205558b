"""Idempotency-Key on the proxied doors (gateway/proxy/idempotency.py): a retried call is
stored once and answered as the first was, against a live server and the demo upstream (its
test hooks hold a call in flight: tests/gateway/upstream_harness.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.gateway.proxy_support import auth, upstream_received
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"
DEADLINE = 30.0


@dataclass
class Gateway:
    server: LiveServer
    key: str
    other: str  # another source's key
    reader: str
    upstream: str


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    with live_server(tmp_path_factory.mktemp("idem"), {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        yield Gateway(
            server,
            server.make_key("ingest", name="idem-a"),
            server.make_key("ingest", name="idem-b"),
            server.make_key("read", name="idem-reader"),
            demo_upstream,
        )


def _chat(gw: Gateway, *, key: str, idem: str | None, stream: bool, text: str, headers: dict | None = None):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 8,
        "stream": stream,
    }
    h = {**auth(key), **(headers or {})}
    if idem is not None:
        h["Idempotency-Key"] = idem
    return httpx.post(f"{gw.server.url}/v1/chat/completions", json=body, headers=h, timeout=60)


def _steps(gw: Gateway, trajectory: str) -> list[dict]:
    r = httpx.get(
        f"{gw.server.url}/api/v1/steps",
        params={"trajectory_uid": trajectory},
        headers=auth(gw.reader),
        timeout=30,
    )
    r.raise_for_status()
    return r.json()["results"]


# (row, stream, named trajectory)
ROWS = [
    ("whole, minted trajectory", False, False),
    ("whole, named trajectory", False, True),
    ("streamed, minted trajectory", True, False),
    ("streamed, named trajectory", True, True),
]


@pytest.mark.parametrize(("row", "stream", "named"), ROWS, ids=[r[0] for r in ROWS])
def test_a_retry_gets_the_first_answer_and_stores_nothing(gw, row, stream, named):
    idem = uuid.uuid4().hex
    headers = {"X-Claw-Trajectory": f"idem-{uuid.uuid4().hex[:8]}"} if named else {}
    first = _chat(gw, key=gw.key, idem=idem, stream=stream, text=f"Hello {row}", headers=headers)
    assert first.status_code == 200, first.text
    trajectory = first.headers["X-Claw-Trajectory"]
    stored = _steps(gw, trajectory)
    assert len(stored) == 1

    # when: the client retries the same call with the same key
    retry = _chat(gw, key=gw.key, idem=idem, stream=stream, text=f"Hello {row}", headers=headers)

    # then: the same answer, byte for byte (an event stream when it streamed), the same
    # trajectory, marked as a replay; and nothing new is stored
    assert retry.status_code == 200
    assert retry.content == first.content
    assert retry.headers["content-type"] == first.headers["content-type"]
    assert retry.headers["X-Claw-Trajectory"] == trajectory
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert first.headers.get("X-Claw-Steps") == retry.headers.get("X-Claw-Steps")
    assert _steps(gw, trajectory) == stored


def test_a_retry_while_the_first_call_runs_is_told_to_wait(gw):
    idem, name = uuid.uuid4().hex, f"held-{uuid.uuid4().hex[:8]}"
    traj = f"idem-held-{uuid.uuid4().hex[:8]}"
    held = {"x-test-barrier": f"{name}:2", "x-test-record": name, "X-Claw-Trajectory": traj}
    results: dict[str, httpx.Response] = {}
    # given: a first call held at the upstream (a barrier of two that only it has reached)
    first = threading.Thread(
        target=lambda: results.setdefault(
            "first", _chat(gw, key=gw.key, idem=idem, stream=False, text="held", headers=held)
        )
    )
    first.start()
    deadline = time.monotonic() + DEADLINE
    while not upstream_received(gw.upstream, name):
        assert time.monotonic() < deadline, "the first call never reached the upstream"
        time.sleep(0.05)

    # when: the client retries while it runs
    retry = _chat(gw, key=gw.key, idem=idem, stream=False, text="held", headers={"X-Claw-Trajectory": traj})

    # then: 409 with Retry-After, and the upstream was not called a second time
    assert retry.status_code == 409, retry.text
    assert retry.json()["error"]["code"] == "idempotency_in_progress"
    assert retry.headers["Retry-After"] == "1"
    assert len(upstream_received(gw.upstream, name)) == 1

    # and: once the first call is let through, it is answered, and a retry now gets its answer
    release = {"x-test-barrier": f"{name}:2", "X-Claw-Trajectory": f"{traj}-release"}
    assert _chat(gw, key=gw.key, idem=None, stream=False, text="release", headers=release).status_code == 200
    first.join(DEADLINE)
    assert results["first"].status_code == 200
    again = _chat(gw, key=gw.key, idem=idem, stream=False, text="held", headers={"X-Claw-Trajectory": traj})
    assert again.status_code == 200 and again.content == results["first"].content
    assert len(_steps(gw, traj)) == 1


def test_the_same_key_with_another_request_is_refused(gw):
    idem = uuid.uuid4().hex
    first = _chat(gw, key=gw.key, idem=idem, stream=False, text="one")
    assert first.status_code == 200
    other = _chat(gw, key=gw.key, idem=idem, stream=False, text="two")
    assert other.status_code == 422, other.text
    assert other.json()["error"]["code"] == "idempotency_mismatch"
    assert other.json()["error"]["param"] == "Idempotency-Key"
    assert "X-Claw-Trajectory" not in other.headers


def test_keys_are_per_source(gw):
    # the same key from another source is that source's own call
    idem = uuid.uuid4().hex
    a = _chat(gw, key=gw.key, idem=idem, stream=False, text="per source")
    b = _chat(gw, key=gw.other, idem=idem, stream=False, text="per source")
    assert a.status_code == b.status_code == 200
    assert a.headers["X-Claw-Trajectory"] != b.headers["X-Claw-Trajectory"]
    assert "Idempotent-Replayed" not in b.headers


def test_a_call_that_fails_upstream_gives_its_key_back(gw):
    # given: a first try the upstream refuses (a field it does not know), so nothing is stored
    idem = uuid.uuid4().hex
    refused = _chat(
        gw, key=gw.key, idem=idem, stream=False, text="refused", headers={"x-test-refuse": "model"}
    )
    assert refused.status_code == 400
    # when: the client retries: the call runs again and is stored
    retry = _chat(gw, key=gw.key, idem=idem, stream=False, text="refused")
    assert retry.status_code == 200
    assert "Idempotent-Replayed" not in retry.headers
    assert len(_steps(gw, retry.headers["X-Claw-Trajectory"])) == 1


@pytest.mark.parametrize("bad", ["", "x" * 256, "caf\u00e9", "a b"])
def test_a_malformed_key_is_a_400_naming_the_header(gw, bad):
    r = httpx.post(
        f"{gw.server.url}/v1/chat/completions",
        content=b'{"model": "claw-demo", "messages": [{"role": "user", "content": "x"}]}',
        headers={**auth(gw.key), "Idempotency-Key": bad.encode(), "Content-Type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "Idempotency-Key"


# --- the crash window: killed between the steps' commit and the keeping of the answer -------------
@pytest.fixture(scope="module")
def crashing(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    """A live server of its own: each test restarts it with CLAW_TEST_CRASH_AT set."""
    env = {"CLAW_UPSTREAM_URL": demo_upstream, "CLAW_IDEMPOTENCY_RUNNING_SECONDS": "3600"}
    with live_server(tmp_path_factory.mktemp("idem-crash"), env) as server:
        yield Gateway(
            server,
            server.make_key("ingest", name="crash-a"),
            "",
            server.make_key("read", name="crash-reader"),
            demo_upstream,
        )


def _restart(gw: Gateway, **env: str | None) -> None:
    for name, value in env.items():
        if value is None:
            gw.server.env.pop(name, None)
        else:
            gw.server.env[name] = value
    gw.server.restart(kill=True)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_process_killed_before_keeping_the_answer_never_stores_the_step_twice(crashing, stream):
    gw = crashing
    idem, name = uuid.uuid4().hex, f"crash-{uuid.uuid4().hex[:8]}"
    traj = f"idem-crash-{uuid.uuid4().hex[:8]}"
    headers = {"X-Claw-Trajectory": traj, "x-test-record": name}
    _restart(gw, CLAW_TEST_CRASH_AT="idempotency.kept", CLAW_IDEMPOTENCY_RUNNING_SECONDS="3600")
    proc = gw.server.proc
    assert proc is not None

    # when: a call with an Idempotency-Key dies at the exact point its steps are committed and
    # its answer is not yet kept (gateway/proxy/faults.py crash_point)
    with pytest.raises(httpx.TransportError):
        _chat(gw, key=gw.key, idem=idem, stream=stream, text="crash", headers=headers).raise_for_status()
    deadline = time.monotonic() + DEADLINE
    while proc.poll() is None:
        assert time.monotonic() < deadline, "the server was not killed at the crash point"
        time.sleep(0.05)
    assert proc.returncode == -9  # SIGKILL, not an exit

    # then: its step was committed, once
    _restart(gw, CLAW_TEST_CRASH_AT=None)
    stored = _steps(gw, traj)
    assert [s["step_index"] for s in stored] == [0]
    assert len(upstream_received(gw.upstream, name)) == 1

    # and: a retry with the same key within CLAW_IDEMPOTENCY_RUNNING_SECONDS is told to wait,
    # and past it that the outcome is unknown (idempotency.py); neither runs the call again
    outcomes = []
    for running_seconds in ("3600", "0"):
        if running_seconds != "3600":
            _restart(gw, CLAW_IDEMPOTENCY_RUNNING_SECONDS=running_seconds)
        retry = _chat(gw, key=gw.key, idem=idem, stream=stream, text="crash", headers=headers)
        assert retry.headers["content-type"].startswith("application/json"), retry.text
        error = retry.json()["error"]
        outcomes.append((retry.status_code, error["code"], error["param"]))
        assert "X-Claw-Trajectory" not in retry.headers
        assert _steps(gw, traj) == stored
        assert len(upstream_received(gw.upstream, name)) == 1
    assert outcomes == [
        (409, "idempotency_in_progress", "Idempotency-Key"),
        (409, "idempotency_unknown", "Idempotency-Key"),
    ]

    # and: the same call with a new key runs, as the documented remedy
    again = _chat(gw, key=gw.key, idem=uuid.uuid4().hex, stream=stream, text="crash", headers=headers)
    assert again.status_code == 200, again.text
    assert [s["step_index"] for s in _steps(gw, traj)] == [0, 1]
