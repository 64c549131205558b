"""bench.sse: the gateway's SSE parser (claw_kit.llm.sse.sse_data) vs httpx-sse, in one run.

    python -m bench.sse [--streams 3000]

Correctness: the spec cases of tests/gateway/test_stream.py through each parser, each case
fed whole and byte by byte; a case passes when both feeds give the spec's events.

CPU: a realistic stream, the demo upstream's streamed answer to bench.proxy's request (the
2.4k-token toy chat prompt, ``return_token_ids`` and ``logprobs`` on: the first event carries
the ~2.4k prompt ids, then one event per token with its id and logprob, a usage event and
``[DONE]``), as the chunks the upstream sends. Each parser reads it from an httpx.Response,
as the gateway does, and hands over each event's data as bytes (what the relay writes;
httpx-sse yields str, so its figure includes the ``encode``). Process CPU time per stream,
blocks in the order hand-written, httpx-sse, httpx-sse, hand-written. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

import httpx
import orjson
from httpx_sse import EventSource

from bench.proxy import make_bodies
from claw_kit.llm.sse import sse_data
from claw_site.demo.upstream import create_app
from tests.gateway.test_stream import SPEC_CASES

Parser = Callable[[httpx.Response], AsyncIterator[bytes]]


def hand_written(resp: httpx.Response) -> AsyncIterator[bytes]:
    return sse_data(resp.aiter_raw())


async def httpx_sse(resp: httpx.Response) -> AsyncIterator[bytes]:
    async for event in EventSource(resp).aiter_sse():
        yield event.data.encode()


PARSERS: dict[str, Parser] = {"hand_written": hand_written, "httpx_sse": httpx_sse}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=3000, help="per parser, split over its blocks")
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(_run(args.streams))), flush=True)


async def _run(streams: int) -> dict:
    spec = {name: await _spec_failures(parse) for name, parse in PARSERS.items()}
    chunks = await _realistic_stream()
    events = await _events(hand_written, chunks)
    assert events == await _events(httpx_sse, chunks), "the parsers disagree on the realistic stream"
    cpu = {name: 0.0 for name in PARSERS}
    order = ("hand_written", "httpx_sse", "httpx_sse", "hand_written")
    for name in order:
        t0 = time.process_time()
        for _ in range(streams // 2):
            await _events(PARSERS[name], chunks)
        cpu[name] += time.process_time() - t0
    us = {name: cpu[name] / (streams // 2 * 2) * 1e6 for name in PARSERS}
    return {
        "spec_cases": len(SPEC_CASES),
        "spec_passed_hand_written": len(SPEC_CASES) - len(spec["hand_written"]),
        "spec_passed_httpx_sse": len(SPEC_CASES) - len(spec["httpx_sse"]),
        "spec_failed_httpx_sse": spec["httpx_sse"],
        "spec_failed_hand_written": spec["hand_written"],
        "stream_events": len(events),
        "stream_bytes": sum(len(c) for c in chunks),
        "cpu_us_per_stream_hand_written": round(us["hand_written"], 1),
        "cpu_us_per_stream_httpx_sse": round(us["httpx_sse"], 1),
        "cpu_ratio_httpx_sse_over_hand_written": round(us["httpx_sse"] / us["hand_written"], 2),
        "cpu_us_per_event_saved": round((us["httpx_sse"] - us["hand_written"]) / len(events), 2),
        "streams_per_parser": streams // 2 * 2,
        "workload": "demo upstream's streamed answer to a 2.4k-token chat, token ids and logprobs on",
    }


async def _spec_failures(parse: Parser) -> list[str]:
    failed = []
    for name, stream, expected in SPEC_CASES:
        bytewise = [stream[i : i + 1] for i in range(len(stream))]
        if await _events(parse, [stream]) != expected or await _events(parse, bytewise) != expected:
            failed.append(name)
    return failed


async def _events(parse: Parser, chunks: list[bytes]) -> list[bytes]:
    resp = httpx.Response(
        200, headers={"content-type": "text/event-stream; charset=utf-8"}, stream=_Chunks(chunks)
    )
    return [data async for data in parse(resp)]


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]):
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


async def _realistic_stream() -> list[bytes]:
    """The body chunks the demo upstream sends for bench.proxy's first request, streamed."""
    body = orjson.loads(make_bodies(1, 2400, seed=0)[0])
    body.update(stream=True, return_token_ids=True, logprobs=True, stream_options={"include_usage": True})
    raw = orjson.dumps(body)
    sent: list[bytes] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            sent.append(message["body"])

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "headers": [(b"content-type", b"application/json")],
    }
    await create_app()(scope, receive, send)
    return sent


if __name__ == "__main__":
    main()
