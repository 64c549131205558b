"""A fast HTTP/1.1 transport for httpx: keep-alive connections on asyncio protocols,
responses parsed by httptools (the C parser uvicorn uses).

Why: bench.transport runs two gateways side by side that differ only in this transport vs
httpx's default one (httpcore + h11 + anyio): on the 2.4k-token chat with a zero-latency
upstream, gateway CPU per proxied call was 1.22 vs 2.58 ms (ratio 0.47) and c=32 throughput
1.76x (docs/architecture.md, "Hand-written infrastructure, and why"). It plugs into httpx's public
transport interface, so requests, responses, streaming and exceptions are httpx's own
(ConnectError, ConnectTimeout, ReadTimeout, RemoteProtocolError...), and
CLAW_UPSTREAM_TRANSPORT=httpx swaps it out.

Scope: what an OpenAI-compatible upstream needs. HTTP/1.1 only, one request at a time per
connection, bodies given as bytes, responses with Content-Length, chunked encoding or
(tolerated) connection close; HEAD answers and 1xx interim answers are handled. A body cut
short raises RemoteProtocolError and its connection is never reused. A request on a reused
keep-alive connection that the server closed before sending anything is retried once on a
new connection (the server never answered it). Bound to the event loop that created it:
make one per loop.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any

import httptools
import httpx

# Pause reading when this much response body waits unread (a slow consumer); resume below LOW.
_HIGH_WATER = 1 << 20
_LOW_WATER = 1 << 18


class FastTransport(httpx.AsyncBaseTransport):
    """A keep-alive connection pool per (scheme, host, port); see the module docstring."""

    def __init__(self, *, max_idle_per_host: int = 1024, verify: ssl.SSLContext | bool = True):
        self._idle: dict[tuple[str, str, int], deque[_Conn]] = {}
        self._max_idle = max_idle_per_host
        self._verify = verify
        self._ssl: ssl.SSLContext | None = verify if isinstance(verify, ssl.SSLContext) else None
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeouts = request.extensions.get("timeout") or {}
        head = _request_head(request)
        body = request.content
        for attempt in (0, 1):
            # The retry takes a new connection: the other idle ones may be just as stale.
            conn, reused = await self._acquire(key, timeouts.get("connect"), request, fresh=attempt == 1)
            conn.begin(head_only=request.method == "HEAD")
            conn.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.transport.write(body)
            try:
                await conn.read_head(timeouts.get("read"), request)
            except httpx.RemoteProtocolError:
                conn.close()
                if reused and attempt == 0 and conn.received == 0:
                    continue  # a stale keep-alive connection: the server never saw the request
                raise
            except BaseException:
                conn.close()
                raise
            return httpx.Response(
                conn.status or 0,
                headers=conn.headers,
                stream=_Body(self, key, conn, timeouts.get("read"), request),
                extensions={"http_version": b"HTTP/1.1"},
                request=request,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    async def fetch(self, method: str, url: httpx.URL, headers: dict[str, str], body: bytes) -> Whole:
        """Send a request and read its whole answer: what ``handle_async_request`` + ``aread``
        do, without httpx's Request and Response objects and its async byte streams (~80 us
        of a proxied call's ~1 ms of CPU). The same head bytes, retry of a stale keep-alive
        connection and exceptions; no per-read timeout (the caller bounds the whole call)."""
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        head = _head(method, url, headers, len(body))
        for attempt in (0, 1):
            conn, reused = await self._acquire(key, None, None, fresh=attempt == 1)
            conn.begin(head_only=method == "HEAD")
            conn.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                conn.transport.write(body)
            try:
                await conn.read_head(None, None)
                parts = []
                while (chunk := await conn.read_chunk(None, None)) is not None:
                    parts.append(chunk)
            except httpx.RemoteProtocolError:
                conn.close()
                if reused and attempt == 0 and conn.received == 0:
                    continue  # a stale keep-alive connection: the server never saw the request
                raise
            except BaseException:
                conn.close()
                raise
            self._release(key, conn)
            return Whole(conn.status or 0, conn.headers, parts[0] if len(parts) == 1 else b"".join(parts))
        raise AssertionError("unreachable")  # pragma: no cover

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            while idle:
                idle.pop().close()

    # --- pool ---------------------------------------------------------------------------------------
    async def _acquire(
        self, key: tuple[str, str, int], timeout: float | None, request: httpx.Request | None, *, fresh: bool
    ) -> tuple[_Conn, bool]:
        idle = None if fresh else self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.usable():
                return conn, True
        scheme, host, port = key
        tls = None
        if scheme == "https":
            if self._ssl is None:  # made on first use: loading the CA store costs ~30 ms
                self._ssl = ssl.create_default_context()
                if not self._verify:
                    self._ssl.check_hostname = False
                    self._ssl.verify_mode = ssl.CERT_NONE
            tls = self._ssl
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, conn = await loop.create_connection(
                    _Conn,
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls is not None else None,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting to the upstream", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from None
        return conn, False

    def _release(self, key: tuple[str, str, int], conn: _Conn) -> None:
        if self._closed or not conn.reusable():
            conn.close()
            return
        idle = self._idle.setdefault(key, deque())
        if len(idle) >= self._max_idle:
            conn.close()
            return
        idle.append(conn)


class _Body(httpx.AsyncByteStream):
    """The response body, read from the connection as it arrives; returns the connection to
    the pool once the body was read whole (or closes it when abandoned early)."""

    def __init__(
        self,
        pool: FastTransport,
        key: tuple[str, str, int],
        conn: _Conn,
        timeout: float | None,
        request: httpx.Request,
    ):
        self._pool, self._key, self._conn, self._timeout, self._request = pool, key, conn, timeout, request
        self._done = False

    async def __aiter__(self):  # type: ignore[override]
        conn = self._conn
        while True:
            chunk = await conn.read_chunk(self._timeout, self._request)
            if chunk is None:
                break
            yield chunk
        await self.aclose()

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        if self._conn.complete:
            self._pool._release(self._key, self._conn)
        else:
            self._conn.close()


class _Conn(asyncio.Protocol):
    """One connection: an asyncio protocol feeding httptools; one response at a time."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.keep_alive = False
        self.exc: Exception | None = None
        self._waiter: asyncio.Future | None = None
        self._parser_spent = False
        self.begin()

    def begin(self, *, head_only: bool = False) -> None:
        """Reset the per-response state before a request is written; ``head_only`` for a HEAD
        request, whose answer has headers only (its Content-Length describes a body not sent)."""
        if self._parser_spent:
            # httptools cannot be told that a HEAD answer has no body: it still waits for the
            # announced bytes, so the next answer gets a parser of its own.
            self.parser = httptools.HttpResponseParser(self)
            self._parser_spent = False
        self.head_only = head_only
        self.informational = False
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.head_done = False
        self.complete = False
        self.received = 0
        self.exc = None

    def usable(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and self.usable()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- asyncio protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.exc = httpx.RemoteProtocolError(f"malformed response from the upstream: {exc}")
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.head_done and not self.complete and not self._framed():
            self.complete = True  # a body delimited by the connection's end (no length, not chunked)
            self.keep_alive = False
        self._wake()

    def _framed(self) -> bool:
        return any(k.lower() in (b"content-length", b"transfer-encoding") for k, _ in self.headers)

    # --- httptools callbacks ------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows.
            self.headers = []
            self.informational = True
            return
        self.status = status
        self.head_done = True
        if self.head_only:
            self.complete = True
            self.keep_alive = self.parser.should_keep_alive()
            self._parser_spent = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self.head_only:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self.informational:
            self.informational = False
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()
        self._wake()

    # --- reading ------------------------------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self, timeout: float | None, request: httpx.Request | None) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            if timeout is None:
                await self._waiter
                return
            async with asyncio.timeout(timeout):
                await self._waiter
        except TimeoutError:
            self.close()
            raise httpx.ReadTimeout("timed out reading from the upstream", request=request) from None
        finally:
            self._waiter = None

    async def read_head(self, timeout: float | None, request: httpx.Request | None) -> None:
        while not self.head_done:
            self._raise_if_broken()
            await self._wait(timeout, request)

    async def read_chunk(self, timeout: float | None, request: httpx.Request | None) -> bytes | None:
        """The next body chunk, or None at the end of the response."""
        while True:
            if self.chunks:
                chunk = self.chunks.popleft()
                self.buffered -= len(chunk)
                if self.paused and self.buffered < _LOW_WATER and self.transport is not None:
                    self.paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            self._raise_if_broken()
            await self._wait(timeout, request)

    def _raise_if_broken(self) -> None:
        if self.exc is not None:
            raise self.exc
        if self.closed:
            raise httpx.RemoteProtocolError(
                "the upstream closed the connection before the response completed"
            )


class Whole:
    """A whole answer read by ``FastTransport.fetch``: the part of an httpx.Response its
    callers read (status, headers, body), without the stream machinery."""

    __slots__ = ("_headers", "_raw_headers", "content", "status_code")

    def __init__(self, status_code: int, raw_headers: list[tuple[bytes, bytes]], content: bytes):
        self.status_code = status_code
        self.content = content
        self._raw_headers = raw_headers
        self._headers: httpx.Headers | None = None

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._raw_headers)
        return self._headers

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return httpx.Response(self.status_code, content=self.content).json()

    async def aread(self) -> bytes:
        return self.content

    async def aclose(self) -> None:
        return None


def _head(method: str, url: httpx.URL, headers: dict[str, str], length: int) -> bytes:
    """The request head ``_request_head`` writes for an httpx.Request of these headers and a
    body of ``length`` bytes (Host first, Content-Length last), built as one string."""
    lines = [f"{method} {url.raw_path.decode('ascii')} HTTP/1.1", f"Host: {url.netloc.decode('ascii')}"]
    lines.extend(f"{k}: {v}" for k, v in headers.items())
    if method not in ("GET", "HEAD") or length:
        lines.append(f"Content-Length: {length}")
    text = "\r\n".join(lines) + "\r\n\r\n"
    if not text.isascii() or any(c in v for v in headers.values() for c in "\r\n\0"):
        # What httpx does with such values (its encoding rules and errors) is the rule.
        return _request_head(httpx.Request(method, url, headers=headers, content=b"x" * length))
    return text.encode("ascii")


def _request_head(request: httpx.Request) -> bytes:
    url = request.url
    lines = [request.method.encode() + b" " + url.raw_path + b" HTTP/1.1"]
    lines.extend(k + b": " + v for k, v in request.headers.raw)
    return b"\r\n".join(lines) + b"\r\n\r\n"
