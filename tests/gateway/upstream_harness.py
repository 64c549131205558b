"""The demo upstream as the gateway tests run it: ``claw_site.demo.upstream``'s app, served on a
listening socket made by the test process (``--fd``; no port picked first and bound later),
plus two hooks that let a test wait on a condition instead of on the clock.

The hooks are request headers, which the gateway forwards like any other agent header:

- ``x-test-barrier: NAME:N`` holds the request until N requests of barrier NAME have arrived,
  then all of them are answered. None is answered before, so the barrier opens only when N
  are in flight at once; if that has not happened after BARRIER_TIMEOUT_S, the waiting
  requests are answered 503, saying how many arrived.
- ``x-test-hold: NAME`` is not answered: the request is held until its client (the gateway)
  disconnects, and then NAME is recorded. ``GET /test/disconnected`` lists the names
  recorded. A client still connected after HOLD_TIMEOUT_S gets the demo answer after all.

Two more let a test see what the upstream was asked, and play a server that lacks a feature:

- ``x-test-record: NAME`` keeps the request's JSON body; ``GET /test/received/NAME`` lists
  the bodies kept under NAME, in arrival order.
- ``x-test-refuse: FIELD[,FIELD...]`` answers a request whose body sets one of those fields
  (to anything but null or false) 400, naming the first such field, as a server that does not
  know it would; a request without them gets the demo answer.

``python -m tests.gateway.upstream_harness --fd N [demo upstream options]``
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import orjson

from claw_site.demo import upstream

# Both far beyond what the tests need (the barrier fills in well under a second; a
# disconnect reaches the upstream in milliseconds) and below the clients' timeouts.
BARRIER_TIMEOUT_S = 45.0
HOLD_TIMEOUT_S = 60.0

Message = dict[str, Any]


def with_hooks(app: Any) -> Any:
    """``app`` with the test hooks described in the module docstring."""
    barriers: dict[str, _Barrier] = {}
    disconnected: list[str] = []
    received: dict[str, list[Any]] = {}

    async def hooked(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] == "/test/disconnected":
            await _answer(send, 200, disconnected)
            return
        if scope["path"].startswith(_RECEIVED):
            await _answer(send, 200, received.get(scope["path"][len(_RECEIVED) :], []))
            return
        headers = dict(scope["headers"])
        barrier, hold = headers.get(b"x-test-barrier"), headers.get(b"x-test-hold")
        record, refuse = headers.get(b"x-test-record"), headers.get(b"x-test-refuse")
        if barrier is None and hold is None and record is None and refuse is None:
            await app(scope, receive, send)
            return
        # Read the body now: from then on, the client's receive() returns only on disconnect.
        body = await _read_body(receive)
        if record is not None:
            received.setdefault(record.decode(), []).append(orjson.loads(body) if body else None)
        if refuse is not None:
            sent = orjson.loads(body) if body else {}
            named = [f for f in refuse.decode().split(",") if _is_set(sent.get(f))]
            if named:
                message = f"{named[0]} is not supported by this server"
                error = {"message": message, "type": "invalid_request_error", "param": named[0], "code": None}
                await _answer(send, 400, {"error": error})
                return
        if barrier is not None:
            name, _, n = barrier.decode().rpartition(":")
            gate = barriers.setdefault(name, _Barrier(int(n)))
            if not await gate.pass_through():
                message = (
                    f"barrier {name}: {gate.arrived} of {gate.n} requests arrived in {BARRIER_TIMEOUT_S} s"
                )
                await _answer(send, 503, {"error": {"message": message, "type": "test_barrier"}})
                return
        if hold is not None:
            try:
                message = await asyncio.wait_for(receive(), HOLD_TIMEOUT_S)
            except TimeoutError:
                pass
            else:
                if message["type"] == "http.disconnect":
                    disconnected.append(hold.decode())
                    return
        await app(scope, _replay(body, receive), send)

    return hooked


_RECEIVED = "/test/received/"


def _is_set(value: Any) -> bool:
    return value is not None and value is not False  # 0 is set: == would take it for False


class _Barrier:
    def __init__(self, n: int):
        self.n = n
        self.arrived = 0
        self.full = asyncio.Event()

    async def pass_through(self) -> bool:
        """Wait until ``n`` requests arrived; False when BARRIER_TIMEOUT_S passed first."""
        self.arrived += 1
        if self.arrived >= self.n:
            self.full.set()
        try:
            await asyncio.wait_for(self.full.wait(), BARRIER_TIMEOUT_S)
        except TimeoutError:
            return False
        return True


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away while sending: the app sees an empty body
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """A receive() that gives the app the body read already, then the client's messages."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def _answer(send: Any, status: int, payload: Any) -> None:
    body = orjson.dumps(payload)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main(argv: list[str] | None = None) -> None:
    """Serve the demo upstream (``python -m claw_site.demo.upstream``'s options, ``--fd``
    required here) with the hooks."""
    argv = sys.argv[1:] if argv is None else argv
    if "--fd" not in argv:
        raise SystemExit("upstream_harness serves on an inherited socket: pass --fd N")
    upstream.main(argv, wrap=with_hooks)


if __name__ == "__main__":
    main()
