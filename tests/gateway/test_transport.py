"""claw_kit.llm.transport.FastTransport against real local servers that write raw HTTP bytes:
framing (Content-Length, chunked with extensions and trailers, bodyless statuses, HEAD, a
body ended by the connection's close), keep-alive reuse counted on the server side, servers
that close mid-body, and stale keep-alive connections."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest

from claw_kit.llm.transport import FastTransport, _head, _request_head

# A guard against a hang turning into a 300 s pytest timeout; never reached when a test passes.
GUARD = httpx.Timeout(10.0)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@dataclass
class Seen:
    """A request as the server read it, and the number of the connection it came on (1, 2...)."""

    method: str
    path: str
    body: bytes
    conn: int


@dataclass
class Reply:
    """What the server writes for one request: ``data``, then it closes the connection when
    ``close`` (with ``data`` empty: it read the request and hung up without answering)."""

    data: bytes = b""
    close: bool = False


@dataclass
class RawServer:
    """An asyncio server on a free port; ``answer(seen)`` scripts each reply."""

    answer: Callable[[Seen], Reply | asyncio.Future]
    connections: int = 0
    seen: list[Seen] = field(default_factory=list)

    async def __aenter__(self) -> RawServer:
        self._writers: list[asyncio.StreamWriter] = []
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for w in self._writers:
            w.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = self.connections
        self._writers.append(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ")
                length = 0
                for line in lines:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                seen = Seen(method, path, await reader.readexactly(length), conn)
                self.seen.append(seen)
                reply = self.answer(seen)
                if isinstance(reply, asyncio.Future):
                    reply = await reply
                try:
                    writer.write(reply.data)
                    await writer.drain()
                except ConnectionError:  # the client gave up on this connection
                    return
                if reply.close:
                    return
        finally:
            writer.close()


def always(data: bytes) -> Callable[[Seen], Reply]:
    return lambda seen: Reply(data)


class FetchClient:
    """FastTransport.fetch (the whole-answer path upstream.request takes) behind the calls
    these tests make of an httpx client: every whole-answer test runs on both paths."""

    def __init__(self, transport: FastTransport):
        self.transport = transport

    async def request(self, method: str, url: str, *, content: bytes = b"") -> object:
        async with asyncio.timeout(GUARD.read):  # fetch leaves the bound to its caller
            return await self.transport.fetch(method, httpx.URL(url), {"accept": "*/*"}, content)

    async def get(self, url: str) -> object:
        return await self.request("GET", url)

    async def head(self, url: str) -> object:
        return await self.request("HEAD", url)

    async def post(self, url: str, *, content: bytes = b"") -> object:
        return await self.request("POST", url, content=content)


@pytest.fixture(params=["httpx", "fetch"])
async def client(request):
    transport = FastTransport()
    if request.param == "fetch":
        yield FetchClient(transport)
        await transport.aclose()
        return
    async with httpx.AsyncClient(transport=transport, timeout=GUARD) as c:
        yield c


@pytest.fixture
async def streaming():
    async with httpx.AsyncClient(transport=FastTransport(), timeout=GUARD) as c:
        yield c


async def test_fetch_writes_the_request_head_httpx_would():
    # given: a request of a few headers and a body, as upstream.request sends it
    url = httpx.URL("http://127.0.0.1:8123/v1/chat/completions")
    headers = {"content-type": "application/json", "accept-encoding": "identity", "x-request-id": "r1"}
    body = b'{"model": "m"}'
    # then: fetch's head is byte for byte the head FastTransport writes for the httpx.Request
    expected = _request_head(httpx.Request("POST", url, headers=headers, content=body))
    assert _head("POST", url, headers, len(body)).lower() == expected.lower()
    # and a value httpx would refuse or encode differently goes through httpx's own rules
    with pytest.raises((httpx.InvalidURL, ValueError, UnicodeError, httpx.LocalProtocolError)):
        _head("POST", url, {"x": "caf\u00e9\r\nevil: 1"}, 0)


# --- framing and keep-alive ----------------------------------------------------------------------------
async def test_keep_alive_sends_the_second_request_over_the_same_connection(client):
    # given a server answering with Content-Length
    async with RawServer(always(OK)) as server:
        # when two requests are made one after the other
        first = await client.post(server.url + "/a", content=b"one")
        second = await client.post(server.url + "/b", content=b"two")
        # then both arrive whole on one connection
        assert (first.status_code, first.content, second.content) == (200, b"ok", b"ok")
        assert [(s.method, s.path, s.body) for s in server.seen] == [
            ("POST", "/a", b"one"),
            ("POST", "/b", b"two"),
        ]
        assert server.connections == 1


async def test_a_large_request_body_arrives_whole(client):
    body = bytes(range(256)) * 1024  # 256 KiB: written apart from the head
    async with RawServer(always(OK)) as server:
        assert (await client.post(server.url, content=body)).content == b"ok"
        assert server.seen[0].body == body


async def test_chunked_response_with_extensions_and_trailers_then_reuse(client):
    # given a chunked answer with a chunk extension and a trailer
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
        b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\n\r\n"
    )
    async with RawServer(always(chunked)) as server:
        # when it is read twice
        first = await client.get(server.url)
        second = await client.get(server.url)
        # then the body is the chunks joined, the trailer is not a body byte, the connection is kept
        assert first.content == second.content == b"hello world"
        assert first.headers["transfer-encoding"] == "chunked"
        assert server.connections == 1


async def test_chunked_response_streamed_chunk_by_chunk(streaming):
    client = streaming
    # given a chunked answer whose chunks the test writes one at a time
    replies = iter([Reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"), Reply(OK)])
    async with RawServer(lambda seen: next(replies)) as server:
        async with client.stream("GET", server.url) as resp:
            writer = server._writers[0]
            chunks = resp.aiter_raw()
            got = []
            for piece in (b"first", b"second"):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                got.append(await anext(chunks))  # each chunk is delivered as it arrives
            writer.write(b"0\r\n\r\n")
            rest = [chunk async for chunk in chunks]
        assert got == [b"first", b"second"] and rest == []
        # then the connection, read to its end, serves the next request
        assert (await client.get(server.url)).content == b"ok"
        assert server.connections == 1


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n',
        b"HTTP/1.1 304 Not Modified\r\nContent-Length: 20\r\n\r\n",  # the length of the cached body
    ],
    ids=["204", "304", "304-with-content-length"],
)
async def test_bodyless_statuses_have_no_body_and_keep_the_connection(client, head):
    # given a server that answers first with a bodyless status, then normally
    replies = iter([head, OK])
    async with RawServer(lambda seen: Reply(next(replies))) as server:
        # when both are requested
        bodyless = await client.get(server.url)
        after = await client.get(server.url)
        # then the first has an empty body and the second one came over the same connection
        assert bodyless.content == b""
        assert after.content == b"ok"
        assert server.connections == 1


async def test_head_response_has_no_body_and_keeps_the_connection(client):
    # given a HEAD answer announcing the length of the body it does not send
    replies = iter([b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n", OK])
    async with RawServer(lambda seen: Reply(next(replies))) as server:
        # when HEAD then GET are requested
        head = await client.head(server.url)
        after = await client.get(server.url)
        # then HEAD has no body, and the GET's answer is read right on the same connection
        assert (head.status_code, head.headers["content-length"], head.content) == (200, "11", b"")
        assert after.content == b"ok"
        assert [s.method for s in server.seen] == ["HEAD", "GET"]
        assert server.connections == 1


async def test_informational_answers_are_skipped(client):
    # given a 103 Early Hints head before the real answer
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </x>; rel=preload\r\n\r\n"
    async with RawServer(always(early + OK)) as server:
        resp = await client.get(server.url)
        again = await client.get(server.url)
        # then the client sees the final answer only, and the connection stays usable
        assert (resp.status_code, resp.content, "link" in resp.headers) == (200, b"ok", False)
        assert again.content == b"ok"
        assert server.connections == 1


async def test_a_body_ended_by_the_connection_close_is_complete_and_not_reused(client):
    # given an answer with neither length nor chunking: its body ends where the connection ends
    async with RawServer(lambda seen: Reply(b"HTTP/1.1 200 OK\r\n\r\nuntil close", close=True)) as server:
        first = await client.get(server.url)
        second = await client.get(server.url)
        assert first.content == second.content == b"until close"
        assert server.connections == 2


async def test_connection_close_header_is_honoured(client):
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with RawServer(always(closing)) as server:
        await client.get(server.url)
        await client.get(server.url)
        assert server.connections == 2


# --- servers that hang up ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cut",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nhal",
        b"HTTP/1.1 200 OK\r\nContent-Le",
    ],
    ids=["content-length", "chunked-between-chunks", "chunked-mid-chunk", "mid-head"],
)
async def test_a_server_closing_mid_answer_raises_and_its_connection_is_not_reused(client, cut):
    # given a server that cuts its first answer short, then answers normally
    replies = iter([Reply(cut, close=True), Reply(OK)])
    async with RawServer(lambda seen: next(replies)) as server:
        # when the first answer is read, then it raises instead of returning a truncated body
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(server.url)
        # and the next request goes over a new connection
        assert (await client.get(server.url)).content == b"ok"
        assert server.connections == 2


async def test_a_streamed_body_cut_short_raises_after_the_bytes_that_came(streaming):
    client = streaming
    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b"
    async with RawServer(lambda seen: Reply(cut, close=True)) as server:
        got = b""
        with pytest.raises(httpx.RemoteProtocolError):
            async with client.stream("GET", server.url) as resp:
                async for chunk in resp.aiter_raw():
                    got += chunk
        assert got == b"only ten b"


async def test_a_malformed_answer_raises_and_its_connection_is_not_reused(client):
    replies = iter([Reply(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"), Reply(OK)])
    async with RawServer(lambda seen: next(replies)) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(server.url)
        assert (await client.get(server.url)).content == b"ok"
        assert server.connections == 2


async def test_a_connection_closed_while_idle_is_not_used_again(client):
    # given a server that answers with keep-alive, then closes the connection while it is idle
    async with RawServer(lambda seen: Reply(OK, close=True)) as server:
        # when a second request follows (whether or not the client noticed the close yet)
        first = await client.post(server.url, content=b"1")
        second = await client.post(server.url, content=b"2")
        # then it succeeds on a new connection
        assert first.content == second.content == b"ok"
        assert server.connections == 2


async def test_a_stale_keep_alive_connection_is_retried_once_on_a_new_connection(client):
    # given a connection the server hangs up on when the second request arrives (the race
    # of a keep-alive timeout: the request crossed the server's close)
    def answer(seen: Seen) -> Reply:
        return Reply(close=True) if len(server.seen) == 2 else Reply(OK)

    async with RawServer(answer) as server:
        assert (await client.post(server.url, content=b"1")).content == b"ok"
        # when the second request is sent, then it is retried once, on a new connection
        assert (await client.post(server.url, content=b"2")).content == b"ok"
        assert [(s.body, s.conn) for s in server.seen] == [(b"1", 1), (b"2", 1), (b"2", 2)]
        assert server.connections == 2


async def test_the_retry_opens_a_new_connection_rather_than_another_idle_one(client):
    # given two idle keep-alive connections that the server hangs up on at the next request
    both_in: asyncio.Future = asyncio.get_running_loop().create_future()

    def answer(seen: Seen) -> Reply | asyncio.Future:
        if len(server.seen) <= 2:  # hold the first two answers until both requests arrived,
            if len(server.seen) == 2:  # so that they took two connections
                both_in.set_result(Reply(OK))
            return both_in
        return Reply(close=True) if seen.conn <= 2 else Reply(OK)

    async with RawServer(answer) as server:
        await asyncio.gather(client.get(server.url), client.get(server.url))
        assert server.connections == 2
        # when the next request meets a stale connection, then the retry succeeds on a fresh one
        assert (await client.get(server.url)).content == b"ok"
        assert server.connections == 3


async def test_a_new_connection_that_is_hung_up_on_is_not_retried(client):
    # given a server that reads the first request and closes without answering
    async with RawServer(lambda seen: Reply(close=True)) as server:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(server.url, content=b"once")
        # then the request was sent once: only a reused connection may be stale
        assert len(server.seen) == 1 and server.connections == 1


async def test_a_reused_connection_that_closes_mid_answer_is_not_retried(client):
    # given a reused connection on which the server starts answering, then hangs up
    replies = iter([Reply(OK), Reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab", close=True)])
    async with RawServer(lambda seen: next(replies)) as server:
        await client.post(server.url, content=b"1")
        with pytest.raises(httpx.RemoteProtocolError):
            await client.post(server.url, content=b"2")
        # then nothing was sent again: the server had answered part of it
        assert len(server.seen) == 2 and server.connections == 1


async def test_connect_errors_are_httpx_errors(client):
    # given a port that is bound but not listening (held, so no other process can take it)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        with pytest.raises(httpx.ConnectError):
            await client.get(f"http://127.0.0.1:{held.getsockname()[1]}")


async def test_a_read_timeout_is_an_httpx_error_and_closes_the_connection():
    # given a server that never answers the first request
    never: asyncio.Future = asyncio.get_running_loop().create_future()
    replies = iter([never, Reply(OK)])
    async with RawServer(lambda seen: next(replies)) as server:
        async with httpx.AsyncClient(transport=FastTransport(), timeout=httpx.Timeout(10.0, read=0.05)) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.get(server.url)
            never.set_result(Reply(OK))  # a late answer must not be read as the next one's
            assert (await c.get(server.url)).content == b"ok"
        assert server.connections == 2
