"""The upstream inference server (vLLM, SGLang, any OpenAI-compatible server).

Requests are httpx requests sent through one transport per event loop (its keep-alive pool
belongs to the loop that made it), with no limit on connections, so hundreds of calls stay in
flight without a thread each. The transport is FastTransport (transport.py; bench.transport
measures why), or httpx's own with CLAW_UPSTREAM_TRANSPORT=httpx. httpx's client
layer (cookies, auth flows, redirects) is skipped: a proxy wants none of it.

Secrets: CLAW_UPSTREAM_API_KEY is sent to the upstream as its Bearer key and never logged,
recorded or returned (error texts are scrubbed of it). The agent's own Authorization header
is a Claw key and is never forwarded.

Faults map to HTTP like this: connection refused/reset -> 502, CLAW_UPSTREAM_TIMEOUT passed
-> 504. Upstream 4xx/5xx answers are not faults here: the caller passes them through.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping

import httpx
from django.conf import settings

from .transport import FastTransport

# Headers of the agent's request that never reach the upstream: hop-by-hop headers, our own
# (x-claw-*), the agent's Claw key and anything that would change the body's framing.
_DROP_HEADERS = frozenset(
    {
        "host",
        "authorization",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "x-api-key",  # an Anthropic client's Claw key
        "proxy-connection",
        "cookie",
        "accept-encoding",
        "x-forwarded-for",
        "x-real-ip",
    }
)
_transports: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncBaseTransport] = (
    weakref.WeakKeyDictionary()
)


class UpstreamFault(Exception):
    """The upstream could not be reached or did not answer in time."""

    def __init__(self, status: int, kind: str, message: str):
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


def transport() -> httpx.AsyncBaseTransport:
    """The shared transport of the running event loop (created on first use), of the kind
    CLAW_UPSTREAM_TRANSPORT names."""
    loop = asyncio.get_running_loop()
    t = _transports.get(loop)
    if t is None:
        t = _transports[loop] = _new_transport(settings.CLAW_UPSTREAM_TRANSPORT)
    return t


def _new_transport(kind: str) -> httpx.AsyncBaseTransport:
    if kind == "httpx":
        unlimited = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        return httpx.AsyncHTTPTransport(limits=unlimited)
    return FastTransport()


def url(path: str) -> str:
    """Absolute upstream URL of a server path such as ``/v1/chat/completions`` or ``/tokenize``.

    CLAW_UPSTREAM_URL may be the server root or its ``/v1`` base (both are common); paths are
    taken from the root (vLLM's /tokenize lives there)."""
    base = settings.CLAW_UPSTREAM_URL.rstrip("/")
    if not base:
        raise UpstreamFault(
            502, "not_configured", "no upstream inference server is configured (CLAW_UPSTREAM_URL)"
        )
    if base.endswith("/v1"):
        base = base[:-3]
    return base + path


def forward_headers(incoming: Mapping[str, str]) -> dict[str, str]:
    """Headers sent upstream: the agent's own (minus those above), the upstream key."""
    out = {
        k: v
        for k, v in incoming.items()
        if k.lower() not in _DROP_HEADERS and not k.lower().startswith("x-claw-")
    }
    out["accept-encoding"] = "identity"  # the gateway parses every answer
    key = settings.CLAW_UPSTREAM_API_KEY
    if key:
        out["authorization"] = f"Bearer {key}"
    return out


def forward_meta(meta: Mapping[str, object]) -> dict[str, str]:
    """:func:`forward_headers` of a Django request's ``META`` (the same headers, named in
    lower case), without building ``request.headers`` first: a proxied call's hot path."""
    out: dict[str, str] = {}
    for k, v in meta.items():
        if k.startswith("HTTP_"):
            name = k[5:].replace("_", "-").lower()
            if name not in _DROP_HEADERS and not name.startswith("x-claw-"):
                out[name] = v  # type: ignore[assignment]
    content_type = meta.get("CONTENT_TYPE")
    if content_type:
        out["content-type"] = content_type  # type: ignore[assignment]
    out["accept-encoding"] = "identity"  # the gateway parses every answer
    key = settings.CLAW_UPSTREAM_API_KEY
    if key:
        out["authorization"] = f"Bearer {key}"
    return out


async def request(
    method: str, path: str, *, content: bytes | None, headers: dict[str, str]
) -> httpx.Response:
    """Send a request and read the whole answer within CLAW_UPSTREAM_TIMEOUT (total)."""
    timeout = settings.CLAW_UPSTREAM_TIMEOUT
    t = transport()
    try:
        if isinstance(t, FastTransport):  # the whole answer, without httpx's objects
            async with asyncio.timeout(timeout):
                return await t.fetch(method, _url(path), headers, content or b"")  # type: ignore[return-value]
        req = _request(method, path, content, headers, timeout)
        async with asyncio.timeout(timeout):
            resp = await t.handle_async_request(req)
            try:
                await resp.aread()
            except BaseException:
                await resp.aclose()  # a half-read connection is closed, never pooled
                raise
            return resp
    except TimeoutError:
        raise UpstreamFault(504, "timeout", f"the upstream did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise fault(exc) from None


async def open_stream(path: str, *, content: bytes, headers: dict[str, str]) -> httpx.Response:
    """Send a request and return once the answer's headers arrived; the caller reads the body
    (each read bounded by CLAW_UPSTREAM_TIMEOUT) and must ``aclose()`` it."""
    timeout = settings.CLAW_UPSTREAM_TIMEOUT
    req = _request("POST", path, content, headers, timeout)
    try:
        async with asyncio.timeout(timeout):
            return await transport().handle_async_request(req)
    except TimeoutError:
        raise UpstreamFault(504, "timeout", f"the upstream did not answer within {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise fault(exc) from None


def _request(
    method: str, path: str, content: bytes | None, headers: dict[str, str], timeout: float
) -> httpx.Request:
    limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
    return httpx.Request(method, _url(path), content=content, headers=headers, extensions={"timeout": limits})


def _url(path: str) -> httpx.URL:
    target = url(path)
    parsed = _urls.get(target)
    if parsed is None:  # parsing a URL is a visible share of a proxied call's CPU: parse once
        parsed = _urls[target] = httpx.URL(target)
    return parsed


_urls: dict[str, httpx.URL] = {}


def fault(exc: BaseException) -> UpstreamFault:
    """The UpstreamFault for a transport error (never includes URLs or keys)."""
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamFault(
            504, "timeout", f"the upstream did not answer within {settings.CLAW_UPSTREAM_TIMEOUT:g} s"
        )
    if isinstance(exc, httpx.ConnectError):
        return UpstreamFault(502, "connect_error", "cannot connect to the upstream inference server")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return UpstreamFault(
            502, "upstream_disconnected", "the upstream closed the connection before answering"
        )
    return UpstreamFault(502, "upstream_error", f"upstream transport error ({type(exc).__name__})")


def scrub(text: str) -> str:
    """``text`` without the upstream API key (an upstream may echo it in an error)."""
    key = settings.CLAW_UPSTREAM_API_KEY
    return text.replace(key, "***") if key else text
