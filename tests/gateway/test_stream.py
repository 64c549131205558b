"""claw_kit.llm.sse.sse_data against the WHATWG event-stream rules (line endings, BOM,
multi-line data, comments, fields with and without a space or a colon), whatever the chunk
boundaries; bench.sse runs the same cases through httpx-sse."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import pytest

from claw_kit.llm.sse import sse_data

# (name, stream, the data of each event the spec dispatches)
SPEC_CASES: list[tuple[str, bytes, list[bytes]]] = [
    ("lf", b"data: a\n\ndata: b\n\n", [b"a", b"b"]),
    ("crlf", b"data: a\r\n\r\ndata: b\r\n\r\n", [b"a", b"b"]),
    ("cr", b"data: a\r\rdata: b\r\r", [b"a", b"b"]),
    ("mixed line endings", b"data: a\r\n\ndata: b\r\rdata: c\n\r\n", [b"a", b"b", b"c"]),
    ("multi-line data", b"data: first\ndata: second\ndata:\n\n", [b"first\nsecond\n"]),
    ("comments", b": keep-alive\n\n:x\ndata: y\n: z\n\n", [b"y"]),
    ("no space after the colon", b"data:x\n\n", [b"x"]),
    ("only one space is dropped", b"data:  x\n\n", [b" x"]),
    ("data without a colon", b"data\n\ndata\ndata\n\n", [b"", b"\n"]),
    ("a space before the colon is part of the name", b"data :x\n\n", []),
    ("other fields", b"event: delta\nid: 7\nretry: 100\nfoo: bar\ndata: x\n\n", [b"x"]),
    ("events without data", b"event: ping\n\nid: 1\n\n\n\ndata: x\n\n", [b"x"]),
    ("blank lines between events", b"\n\ndata: a\n\n\n\ndata: b\n\n", [b"a", b"b"]),
    ("leading BOM", b"\xef\xbb\xbfdata: x\n\n", [b"x"]),
    ("a BOM later is not skipped", b"data: x\n\n\xef\xbb\xbfdata: y\n\n", [b"x"]),
    ("colons in the value", b'data: {"a": "b:c"}\n\n', [b'{"a": "b:c"}']),
    (
        "non-ASCII and U+2028 stay in the value",
        b"data: caf\xc3\xa9 \xe2\x80\xa8 x\n\n",
        [b"caf\xc3\xa9 \xe2\x80\xa8 x"],
    ),
    ("done", b"data: {}\n\ndata: [DONE]\n\n", [b"{}", b"[DONE]"]),
]


def splits(stream: bytes) -> Iterable[tuple[str, list[bytes]]]:
    """The stream whole, byte by byte, and cut in two at every position."""
    yield "whole", [stream]
    yield "bytes", [stream[i : i + 1] for i in range(len(stream))]
    for i in range(1, len(stream)):
        yield f"cut at {i}", [stream[:i], b"", stream[i:]]


async def parse(chunks: list[bytes]) -> list[bytes]:
    async def source() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    return [data async for data in sse_data(source())]


@pytest.mark.parametrize("name,stream,expected", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
async def test_events_are_parsed_as_the_spec_says_whatever_the_chunking(name, stream, expected):
    for how, chunks in splits(stream):
        assert await parse(chunks) == expected, how


@pytest.mark.parametrize(
    "stream,expected",
    [
        (b"data: a\n\ndata: [DONE]\n", [b"a", b"[DONE]"]),
        (b"data: a\n\ndata: [DONE]", [b"a", b"[DONE]"]),
        (b"data: a\r\n\r\ndata: [DONE]\r", [b"a", b"[DONE]"]),
        (b"data: a\n\n\n", [b"a"]),
    ],
)
async def test_a_trailing_event_without_its_blank_line_is_still_delivered(stream, expected):
    # the one deliberate difference from the spec (which drops it); see sse_data's docstring
    for how, chunks in splits(stream):
        assert await parse(chunks) == expected, how


async def test_an_event_larger_than_any_chunk_arrives_whole():
    payload = b'{"prompt_token_ids": [' + b", ".join(b"%d" % i for i in range(20_000)) + b"]}"
    stream = b"data: " + payload + b"\n\ndata: [DONE]\n\n"
    chunks = [stream[i : i + 4096] for i in range(0, len(stream), 4096)]
    assert await parse(chunks) == [payload, b"[DONE]"]
