"""uvicorn's HTTP protocol with the guards uvicorn lacks against slow and greedy clients.

uvicorn (httptools) waits forever for a request's headers and body: its only timer is the
keep-alive one, armed between requests and cancelled by the first byte of the next. A client
that sends one header byte a second (slowloris), or announces a large body and sends it
slowly, holds its connection, and its share of the process, for as long as it likes.
``GuardedHttpProtocol`` adds, per connection:

* a header deadline: a request's headers (counted from the connection's start, or from the
  first byte of a request that follows another) must be complete within
  CLAW_HEADER_TIMEOUT_S;
* a body deadline: the body must be complete within CLAW_BODY_TIMEOUT_S of the headers, or,
  past that, keep arriving at a mean of at least CLAW_BODY_MIN_BYTES_PER_S since the headers
  (a large upload over a slow but honest link goes on; a trickle does not). Time during which
  the app is not reading (uvicorn's flow control paused the socket) is the server's, not the
  client's: a deadline that finds reading paused waits again;
* a bound on the connections open at once from one client address (CLAW_MAX_CONNECTIONS_PER_IP,
  0: none), per process: the connection over it is answered 503 and closed before any of
  its bytes is parsed.

A connection past a deadline is answered 408 (when no response has started) and closed; the
app, if it was reading the body, sees the client disconnect. The body size limit itself is
the app's (claw_kit/web/body_limit.py, called as soon as the headers are complete, before
uvicorn reads more than its 64 KiB buffer of the body): a Content-Length over the limit is
answered 413 unread, and a chunked body is counted as it arrives and cut at the limit.

``manage.py serve`` runs uvicorn with it (``http="claw_kit.web.slow_clients:GuardedHttpProtocol"``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from django.conf import settings
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)

# How often a body past its deadline, but still arriving fast enough, is checked again.
_BODY_RECHECK_S = 1.0


class GuardedHttpProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with header and body deadlines and a per-address connection bound
    (see the module docstring)."""

    # Open connections per client address in this process (one event loop per process).
    _open_per_address: dict[str, int] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timeout = float(settings.CLAW_HEADER_TIMEOUT_S)
        self._body_timeout = float(settings.CLAW_BODY_TIMEOUT_S)
        self._body_min_rate = float(settings.CLAW_BODY_MIN_BYTES_PER_S)
        self._per_address = int(settings.CLAW_MAX_CONNECTIONS_PER_IP)
        self._address: str | None = None  # counted in _open_per_address while set
        self._deadline: asyncio.TimerHandle | None = None
        self._body_started = 0.0
        self._body_received = 0

    # --- connection ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else None
        if address is not None and self._per_address > 0:
            open_now = self._open_per_address.get(address, 0)
            if open_now >= self._per_address:
                log.warning(
                    "refused a connection from %s: %d already open (CLAW_MAX_CONNECTIONS_PER_IP)",
                    address,
                    open_now,
                )
                self._refuse(
                    503,
                    current=False,
                    code="too_many_connections",
                    message=f"{open_now} connections from this address are open; the limit is {self._per_address}",
                )
                return
            self._open_per_address[address] = open_now + 1
            self._address = address
        self._arm(self._header_timeout, self._header_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if self._address is not None:
            left = self._open_per_address.get(self._address, 1) - 1
            if left > 0:
                self._open_per_address[self._address] = left
            else:
                self._open_per_address.pop(self._address, None)
            self._address = None

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused or timed out: parse nothing more
        super().data_received(data)

    def handle_websocket_upgrade(self) -> None:
        # The websocket protocol owns the connection from here (its connection_lost is not
        # ours): no HTTP deadline applies, and it no longer counts against the bound.
        self._disarm()
        self._uncount()
        super().handle_websocket_upgrade()

    # --- parser callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a request after another on a kept-alive connection
            self._arm(self._header_timeout, self._header_expired)

    def on_headers_complete(self) -> None:
        self._body_started = time.monotonic()
        self._body_received = 0
        self._arm(self._body_timeout, self._body_expired)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # --- deadlines ----------------------------------------------------------------------------
    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        if delay > 0:
            self._deadline = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_expired(self) -> None:
        self._deadline = None
        self._refuse(
            408,
            current=False,
            code="header_timeout",
            message=f"the request's headers were not complete within {self._header_timeout:g} s (CLAW_HEADER_TIMEOUT_S)",
        )

    def _body_expired(self) -> None:
        self._deadline = None
        if self.flow is not None and self.flow.read_paused:
            # The app is not reading (a full buffer): the wait is the server's, not the client's.
            self._deadline = self.loop.call_later(_BODY_RECHECK_S, self._body_expired)
            return
        elapsed = time.monotonic() - self._body_started
        if self._body_min_rate > 0 and self._body_received >= self._body_min_rate * elapsed:
            self._deadline = self.loop.call_later(_BODY_RECHECK_S, self._body_expired)
            return
        self._refuse(
            408,
            current=True,
            code="body_timeout",
            message=f"the request's body was not complete within {self._body_timeout:g} s (CLAW_BODY_TIMEOUT_S; "
            f"{self._body_received} bytes in {elapsed:.1f} s, under {self._body_min_rate:g} bytes/s)",
        )

    def _refuse(self, status: int, *, current: bool, code: str, message: str) -> None:
        """Answer ``status`` with the project's error shape and close the connection; a
        request still being served sees its client disconnect. ``current``: the request of
        ``self.cycle`` is the one refused (its body is late), so nothing is written once its
        response has started; else (headers late, or over the bound) that cycle, if any, is the
        previous request's, and the answer is written unless its response is under way."""
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None:
            answer = True
        elif current:
            answer = not cycle.response_started
        else:
            answer = not cycle.response_started or cycle.response_complete
        if answer:
            body = orjson.dumps(
                {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}
            )
            reason = b"Request Timeout" if status == 408 else b"Service Unavailable"
            self.transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n%s" % (status, reason, len(body), body)
            )
        if cycle is not None and not cycle.response_complete:
            # From now on the app's sends are dropped and its receive() returns a disconnect.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()
