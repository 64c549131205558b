"""Server-Sent Events: parsing the upstream's stream and rebuilding the whole answer from it.

The gateway relays a stream event for event (one upstream ``data:`` event -> one event to
the agent, sent as soon as it arrives) and meanwhile accumulates it into the shape of a
non-streamed answer, so one recording path serves both. vLLM's ``token_ids`` arrive as
per-chunk deltas and ``prompt_token_ids`` once per choice (on its first chunk, at the top
level for chat, on the choice for completions); both are handled.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any


async def sse_data(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The ``data`` payload of each event in a byte stream, parsed as the WHATWG event-stream
    spec says: lines end in CRLF, LF or CR; a leading BOM is skipped; ``data`` without a colon
    is an empty data line; one space after the colon is dropped; multi-line data is joined with
    newlines; comments, other fields and events without data are dropped.

    One deliberate difference: a trailing event without its final blank line is still
    delivered (the spec drops it). The transport raises on a truncated body, so an end of
    stream here is the upstream's own end, and a ``data: [DONE]`` it forgot to terminate is
    still the end of the answer.

    Bytes throughout, and an event is found with one ``find`` per event rather than a loop
    per line: bench.sse measures it against httpx-sse."""
    buf = b""
    cr = False  # the previous chunk ended with CR: a LF starting this chunk ends the same line
    bom = True  # the stream's first bytes are yet to be checked for a BOM
    async for chunk in chunks:
        if not chunk:
            continue
        if cr and chunk[0] == 10:  # b"\n"
            chunk = chunk[1:]
        cr = chunk.endswith(b"\r")
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buf += chunk
        if bom:
            if len(buf) < 3 and _BOM.startswith(buf):
                continue
            bom = False
            if buf.startswith(_BOM):
                buf = buf[3:]
        while True:
            end = buf.find(b"\n\n")
            if end < 0:
                break
            event, buf = buf[:end], buf[end + 2 :]
            data = _event_data(event)
            if data is not None:
                yield data
    if bom and buf.startswith(_BOM):
        buf = buf[3:]
    if buf.strip(b"\n"):
        data = _event_data(buf)
        if data is not None:
            yield data


_BOM = b"\xef\xbb\xbf"


def _event_data(event: bytes) -> bytes | None:
    parts = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
        elif line == b"data":
            parts.append(b"")
    return b"\n".join(parts) if parts else None


class _Choice:
    __slots__ = (
        "index",
        "text",
        "ids",
        "prompt_ids",
        "logprobs",
        "tool_calls",
        "finish_reason",
        "extra",
        "has_ids",
    )

    def __init__(self, index: int):
        self.index = index
        self.text: list[str] = []
        self.ids: list[int] = []
        self.has_ids = False
        self.prompt_ids: list[int] | None = None
        self.logprobs: list[Any] = []  # chat: logprob entries; completions: token logprobs
        self.tool_calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.extra: dict[str, Any] = {}  # other delta fields (e.g. reasoning_content), concatenated


class StreamAccumulator:
    """Feeds on parsed stream chunks; ``answer()`` returns the equivalent non-streamed body."""

    def __init__(self, *, chat: bool):
        self.chat = chat
        self.head: dict[str, Any] = {}
        self.prompt_ids: list[int] | None = None
        self.usage: dict[str, Any] | None = None
        self.choices: dict[int, _Choice] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        if not self.head:
            self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        top_prompt = chunk.get("prompt_token_ids")
        if isinstance(top_prompt, list) and self.prompt_ids is None:
            self.prompt_ids = top_prompt
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for raw in chunk.get("choices") or ():
            idx = raw.get("index", 0)
            c = self.choices.get(idx)
            if c is None:
                c = self.choices[idx] = _Choice(idx)
            prompt = raw.get("prompt_token_ids")
            if isinstance(prompt, list) and c.prompt_ids is None:
                c.prompt_ids = prompt
            elif isinstance(top_prompt, list) and c.prompt_ids is None:
                c.prompt_ids = top_prompt
            ids = raw.get("token_ids")
            if isinstance(ids, list):
                c.ids.extend(ids)
                c.has_ids = True
            if raw.get("finish_reason") is not None:
                c.finish_reason = raw["finish_reason"]
            lp = raw.get("logprobs")
            if self.chat:
                self._add_delta(c, raw.get("delta") or {})
                if isinstance(lp, dict) and isinstance(lp.get("content"), list):
                    c.logprobs.extend(lp["content"])
            else:
                if isinstance(raw.get("text"), str):
                    c.text.append(raw["text"])
                if isinstance(lp, dict) and isinstance(lp.get("token_logprobs"), list):
                    c.logprobs.extend(lp["token_logprobs"])

    @staticmethod
    def _add_delta(c: _Choice, delta: dict[str, Any]) -> None:
        for key, value in delta.items():
            if key == "content":
                if isinstance(value, str):
                    c.text.append(value)
            elif key == "tool_calls":
                for piece in value or ():
                    slot = c.tool_calls.setdefault(
                        piece.get("index", 0),
                        {"id": None, "type": "function", "function": {"name": None, "arguments": ""}},
                    )
                    if piece.get("id"):
                        slot["id"] = piece["id"]
                    if piece.get("type"):
                        slot["type"] = piece["type"]
                    fn = piece.get("function") or {}
                    if fn.get("name"):
                        slot["function"]["name"] = fn["name"]
                    if isinstance(fn.get("arguments"), str):
                        slot["function"]["arguments"] += fn["arguments"]
            elif key != "role" and value is not None:
                if isinstance(value, str) and isinstance(c.extra.get(key), str):
                    c.extra[key] += value
                else:
                    c.extra[key] = value

    def answer(self) -> dict[str, Any]:
        """The answer as a non-streamed response body (vLLM id fields where the stream had them)."""
        out: dict[str, Any] = dict(self.head)
        choices = []
        for idx in sorted(self.choices):
            c = self.choices[idx]
            choice: dict[str, Any] = {"index": idx, "finish_reason": c.finish_reason}
            if self.chat:
                text = "".join(c.text) if c.text else None
                if text == "" and c.tool_calls:
                    # A tool call's stream opens with an empty content delta; the same call
                    # answered whole has no content (null), and so has its step's response_text.
                    text = None
                message: dict[str, Any] = {"role": "assistant", "content": text}
                if c.tool_calls:
                    message["tool_calls"] = [c.tool_calls[k] for k in sorted(c.tool_calls)]
                message.update(c.extra)
                choice["message"] = message
                choice["logprobs"] = {"content": c.logprobs} if c.logprobs else None
            else:
                choice["text"] = "".join(c.text)
                choice["logprobs"] = {"token_logprobs": c.logprobs} if c.logprobs else None
            if c.prompt_ids is not None:
                choice["prompt_token_ids"] = c.prompt_ids
            if c.has_ids:
                choice["token_ids"] = c.ids
            choices.append(choice)
        out["choices"] = choices
        if self.prompt_ids is not None:
            out["prompt_token_ids"] = self.prompt_ids
        if self.usage is not None:
            out["usage"] = self.usage
        return out
