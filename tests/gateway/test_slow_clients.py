"""Slow and greedy clients against the real `manage.py serve` (claw_kit/web/slow_clients.py):
slowloris headers and a slowly sent 200 MB body are cut by their deadlines while /healthz and
an authenticated API read keep their latency; over-limit bodies are refused as they arrive;
one address holds a bounded number of connections."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.slow_clients import Attack, p99s
from tests.live import LiveServer, live_server

# Connection deadlines and limits are the server's, before any view or database.
pytestmark = pytest.mark.backend_independent

HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 3.0
SLOWLORIS = 50
SAMPLES = 200  # per endpoint and phase: p99 is the second slowest
CLOSE_SLACK_S = 2.5  # a deadline's connection is closed within this past the deadline


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[LiveServer]:
    env = {
        "CLAW_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "CLAW_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
        # The slow body sends a byte a second: far under this mean rate.
        "CLAW_BODY_MIN_BYTES_PER_S": "100000",
        "CLAW_MAX_CONNECTIONS_PER_IP": str(SLOWLORIS + 30),
    }
    with live_server(tmp_path_factory.mktemp("slow-clients"), env, serve=True) as s:
        yield s


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _error(answer: bytes) -> tuple[str, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0].decode(), json.loads(body)["error"]


def test_slowloris_and_a_slow_200mb_body_are_cut_by_their_deadlines_and_do_not_slow_others(server):
    # given: a reader's key, and the latency of /healthz and of an API read with no attack
    key = server.make_key("read")
    targets = [
        ("healthz", f"{server.url}/healthz", {}),
        ("api read", f"{server.url}/api/v1/trajectories?page_size=1", {"Authorization": f"Bearer {key}"}),
    ]
    with httpx.Client(timeout=10) as client:
        baseline = p99s(client, targets, SAMPLES)

        # when: 50 slowloris connections and one slow 200 MB body hold the server meanwhile,
        # measured until the server has closed the first round of them
        attack = Attack(server.port, SLOWLORIS)
        thread = threading.Thread(target=attack.run, daemon=True)
        thread.start()
        try:
            attack.wait_open(10)
            attacked = p99s(
                client, targets, SAMPLES, until=attack.first_round_closed, timeout=BODY_TIMEOUT_S + 15
            )
        finally:
            attack.stop.set()
            thread.join(timeout=10)

    # then: /healthz and the API read kept their latency
    for name, _, _ in targets:
        print(
            f"p99 {name}: {baseline[name] * 1000:.1f} ms without, {attacked[name] * 1000:.1f} ms "
            f"under {SLOWLORIS} slowloris + a slow 200 MB body"
        )
        bound = max(5 * baseline[name], baseline[name] + 0.25)
        assert attacked[name] <= bound, (name, baseline[name], attacked[name])

    # then: every slow connection was closed by its deadline, answered 408 naming it
    closed = attack.closed()
    kinds = {
        "header": [s for s in closed if not s.head.startswith(b"POST")],
        "body": [s for s in closed if s.head.startswith(b"POST")],
    }
    expected = {
        "header": (HEADER_TIMEOUT_S, "header_timeout", "CLAW_HEADER_TIMEOUT_S"),
        "body": (BODY_TIMEOUT_S, "body_timeout", "CLAW_BODY_TIMEOUT_S"),
    }
    assert len(kinds["header"]) >= SLOWLORIS and len(kinds["body"]) >= 1
    for kind, (timeout, code, setting) in expected.items():
        for slow in kinds[kind]:
            held = slow.closed - slow.opened
            assert timeout - 0.05 <= held <= timeout + CLOSE_SLACK_S, (kind, held)
            status, error = _error(slow.answer)
            assert status == "HTTP/1.1 408 Request Timeout"
            assert error["type"] == "invalid_request_error"
            assert error["code"] == code
            assert setting in error["message"]
            assert error["param"] is None


def test_a_body_past_its_deadline_that_keeps_the_minimum_rate_is_read_whole(server):
    # given: a 1.2 MB body sent at ~300 kB/s, three times the server's minimum mean rate
    # (100 kB/s), so it is still arriving when its 3 s deadline comes
    size, piece, every_s = 1_200_000, 30_000, 0.1
    head = b"POST /api/v1/steps HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    pace = threading.Event()  # never set: its wait() paces the sender
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        # when: it is sent at that pace
        start = time.monotonic()
        sock.sendall(head + b"Content-Length: %d\r\n\r\n" % size)
        for i in range(size // piece):
            pace.wait(max(0.0, start + i * every_s - time.monotonic()))
            sock.sendall(b"x" * piece)
        sent_s = time.monotonic() - start
        answer = _read_answer(sock)
    # then: read whole past the deadline and answered by the app (401: no key), not 408
    assert sent_s > BODY_TIMEOUT_S
    status, error = _error(answer)
    assert status == "HTTP/1.1 401 Unauthorized"
    assert error["type"] == "authentication_error"


def _read_answer(sock: socket.socket, timeout: float = 10) -> bytes:
    """One HTTP answer with a Content-Length (the connection may stay open)."""
    out = b""
    deadline = time.monotonic() + timeout
    while b"\r\n\r\n" not in out or len(out.partition(b"\r\n\r\n")[2]) < _length(out):
        left = deadline - time.monotonic()
        assert left > 0, f"no whole answer; got {out[:300]!r}"
        if select.select([sock], [], [], left)[0]:
            chunk = sock.recv(65536)
            assert chunk, f"closed before a whole answer; got {out[:300]!r}"
            out += chunk
    return out


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


LIMIT = 1_000_000  # CLAW_MAX_BODY_BYTES of the next server
PER_ADDRESS = 4  # CLAW_MAX_CONNECTIONS_PER_IP of the next server


@pytest.fixture(scope="module")
def small_server(tmp_path_factory) -> Iterator[LiveServer]:
    env = {
        "CLAW_MAX_BODY_BYTES": str(LIMIT),
        "CLAW_MAX_CONNECTIONS_PER_IP": str(PER_ADDRESS),
        "CLAW_HEADER_TIMEOUT_S": "30",  # the held connections below stay open meanwhile
    }
    with live_server(tmp_path_factory.mktemp("small-limits"), env, serve=True) as s:
        yield s


def _answer_of(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything the server sends until it closes the connection."""
    out = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"the server did not close the connection; it sent {out[:200]!r}"
        if not select.select([sock], [], [], left)[0]:
            continue
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return out
        if not chunk:
            return out
        out += chunk


def _send_until_answered(sock: socket.socket, chunk: bytes) -> int:
    """Send ``chunk`` again and again until the server answers; the bytes sent."""
    sent = 0
    deadline = time.monotonic() + 30
    sock.setblocking(False)
    try:
        while time.monotonic() < deadline:
            readable, writable, _ = select.select([sock], [sock], [], 1)
            if readable:
                return sent
            if writable:
                try:
                    sent += sock.send(chunk)
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
    finally:
        sock.setblocking(True)
    raise AssertionError(f"no answer after {sent} bytes")


def test_bodies_over_the_limit_are_refused_as_they_arrive(small_server):
    # given: a server whose body limit is 1 MB
    piece = b"x" * 65536
    chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
    cases = [
        # (name, head, what the client then sends, the message's start, the most bytes sent)
        (
            "Content-Length over the limit, no byte of the body sent",
            b"POST /api/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Length: 200000000\r\n\r\n",
            None,
            f"request body is 200000000 bytes; the limit is {LIMIT}",
            0,
        ),
        (
            "a chunked body sent as fast as it goes, cut at the limit",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            chunk,
            f"request body exceeds the limit of {LIMIT} bytes",
            # the limit, plus what the kernel's socket buffers took while the answer came back
            LIMIT + 16 * 1024 * 1024,
        ),
    ]
    for name, head, then, message, most in cases:
        with socket.create_connection(("127.0.0.1", small_server.port)) as sock:
            # when: the request comes
            sock.sendall(head)
            sent = _send_until_answered(sock, then) if then else 0
            answer = _answer_of(sock)

        # then: 413 in the error shape, the connection closed, the body never read whole
        status, error = _error(answer)
        assert status == "HTTP/1.1 413 Request Entity Too Large", name
        assert error == {
            "type": "invalid_request_error",
            "code": "payload_too_large",
            "message": message,
            "param": None,
        }, name
        assert sent <= most, (name, sent)


def test_one_address_holds_a_bounded_number_of_connections(small_server):
    # given: PER_ADDRESS connections held open from 127.0.0.1 (each has sent one byte)
    held = [socket.create_connection(("127.0.0.1", small_server.port)) for _ in range(PER_ADDRESS)]
    try:
        for sock in held:
            sock.sendall(b"G")
        # when: one more connects
        with socket.create_connection(("127.0.0.1", small_server.port)) as extra:
            answer = _answer_of(extra)
        # then: it is answered 503, naming the bound, and closed
        status, error = _error(answer)
        assert status == "HTTP/1.1 503 Service Unavailable"
        assert error == {
            "type": "invalid_request_error",
            "code": "too_many_connections",
            "message": f"{PER_ADDRESS} connections from this address are open; the limit is {PER_ADDRESS}",
            "param": None,
        }
    finally:
        held.pop().close()

    # when: one of the held connections closes; then: a new one is served again
    def served() -> bool:
        try:
            return httpx.get(f"{small_server.url}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    _wait(served, 10, "a connection to be served once one of the held ones closed")
    for sock in held:
        sock.close()
