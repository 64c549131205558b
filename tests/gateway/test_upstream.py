"""claw_kit.llm.upstream with each transport CLAW_UPSTREAM_TRANSPORT selects: answers,
streams and fault mapping are the same whichever sends the request."""

from __future__ import annotations

import socket

import httpx
import orjson
import pytest

from claw_kit.llm import upstream
from claw_kit.llm.transport import FastTransport

KINDS = {"fast": FastTransport, "httpx": httpx.AsyncHTTPTransport}


@pytest.fixture(params=sorted(KINDS))
def kind(request, settings) -> str:
    settings.CLAW_UPSTREAM_TRANSPORT = request.param
    settings.CLAW_UPSTREAM_API_KEY = ""
    settings.CLAW_UPSTREAM_TIMEOUT = 30.0
    return request.param


CHAT = {"model": "claw-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def test_the_setting_picks_the_transport(kind):
    assert type(upstream.transport()) is KINDS[kind]
    assert upstream.transport() is upstream.transport()  # one per event loop


async def test_a_call_is_answered_whole(kind, settings, demo_upstream):
    # given the demo upstream
    settings.CLAW_UPSTREAM_URL = demo_upstream
    # when a chat call is sent through the transport
    resp = await upstream.request(
        "POST",
        "/v1/chat/completions",
        content=orjson.dumps(CHAT),
        headers={"content-type": "application/json"},
    )
    # then the whole answer was read
    assert resp.status_code == 200
    assert orjson.loads(resp.content)["choices"][0]["message"]["content"]


async def test_a_stream_is_read_event_by_event(kind, settings, demo_upstream):
    settings.CLAW_UPSTREAM_URL = demo_upstream
    body = orjson.dumps({**CHAT, "stream": True})
    resp = await upstream.open_stream(
        "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    try:
        raw = b"".join([chunk async for chunk in resp.aiter_raw()])
    finally:
        await resp.aclose()
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert raw.rstrip().endswith(b"data: [DONE]")


async def test_a_refused_connection_is_a_502(kind, settings):
    # given a port that is bound but not listening
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        settings.CLAW_UPSTREAM_URL = f"http://127.0.0.1:{held.getsockname()[1]}"
        with pytest.raises(upstream.UpstreamFault) as fault:
            await upstream.request("GET", "/v1/models", content=None, headers={})
    assert (fault.value.status, fault.value.kind) == (502, "connect_error")


async def test_an_upstream_slower_than_the_timeout_is_a_504(kind, settings, demo_upstream):
    # given an upstream that waits 5 s before answering and a 0.1 s timeout
    settings.CLAW_UPSTREAM_URL = demo_upstream
    settings.CLAW_UPSTREAM_TIMEOUT = 0.1
    with pytest.raises(upstream.UpstreamFault) as fault:
        await upstream.request("GET", "/v1/models", content=None, headers={"x-demo-delay-ms": "5000"})
    assert (fault.value.status, fault.value.kind) == (504, "timeout")
