"""The demo upstream: an OpenAI-compatible server that answers like vLLM, with no model.

It is a raw ASGI app (no framework, orjson) because it is the zero-latency baseline of the
gateway benchmark: whatever time a request spends here is time the gateway did not cause.

Contract:
- ``GET /v1/models`` lists one model, ``claw-demo``; ``GET /health`` answers 200.
- ``POST /v1/chat/completions`` and ``POST /v1/completions`` (OpenAI formats, ``stream``, ``n``,
  ``logprobs``, ``stream_options.include_usage``). Prompt ids come from
  :class:`~claw_site.demo.toy_tokenizer.ToyTokenizer`; the reply is a pure function of
  (prompt ids, seed, choice index, max_tokens): a short sentence of 12-40 byte tokens ending in
  <|end|> (finish_reason "stop"), or cut at max_tokens (default 32; "length"). With ``tools`` and a
  last message from the user, choice 0 calls the first tool (or the one tool_choice names):
  content null, finish_reason "tool_calls", ids = encode(compact json of the calls) + <|end|>
  (a tool call is never cut by max_tokens).
- Logprobs, as vLLM gives them when asked: one per response id, part of the same pure
  function (so the same in a stream's chunks as in the whole answer), in [-5, 0). Chat
  (``logprobs: true``): ``choices[i].logprobs.content`` = [{token, logprob, bytes,
  top_logprobs}], with ``top_logprobs: k`` (0-20) alternatives each; completions
  (``logprobs: k``): ``tokens``, ``token_logprobs``, ``top_logprobs`` (max(k, 1) entries),
  ``text_offset`` (from the start of the reply, across chunks too). The alternatives are made
  up: the sampled token and others sharing the remaining probability, most likely first.
- ``return_token_ids: true`` adds vLLM's (>= 0.10.2) fields: chat top-level ``prompt_token_ids``
  and ``choices[i].token_ids``; completions ``choices[i].prompt_token_ids`` and ``token_ids``.
  Streamed, ``prompt_token_ids`` rides on each choice's first chunk and ``token_ids`` are deltas.
  ``return_tokens_as_token_ids: true`` renders logprob tokens as ``token_id:N``. With token ids
  disabled (``--no-token-ids``) all of these are ignored, as a plain OpenAI server would.
- ``POST /v1/messages``: a minimal Anthropic Messages server (text and tool_use, streamed or
  not) with no token ids, as vLLM's own is: the upstream of the gateway's passthrough mode.
- ``POST /tokenize`` ({messages, tools, add_generation_prompt} or {prompt}) -> {tokens, count}
  and ``POST /detokenize`` ({tokens}) -> {prompt}.
- Fault injection: header ``x-demo-fail: <status>`` answers that status with an OpenAI error
  body; ``x-demo-delay-ms: <ms>`` adds latency; ``x-demo-drop: 1`` starts the response (a
  partial JSON body, or a stream's first chunk) and then closes the connection. ``failure_rate``
  turns that share of completion requests into 500s. Any Authorization header is accepted.
- Scripted replies, for end-to-end tests of agents and rewards without a model: a prompt
  that contains ``[demo-reply]`` is answered with the text after its last occurrence, up to
  the end of that message (then <|end|>, or cut at max_tokens), e.g. a user message
  ``What is 6 * 7? [demo-reply]It is 42.\n#### 42``. A chat whose system message contains
  ``[claw-judge]`` (the LLM judge of pool/rewards/judge.py) is answered with the judge's JSON
  ``{"scores": [{"trajectory_id", "explanation", "score"}]}``, one entry per
  ``<rollout id="N">...</rollout>`` block of the user message: 1.0 when the rollout contains
  the ``<reference>...</reference>`` answer as a whole word, else 0.0; without a reference,
  the rollout's length relative to the longest one.
- Degenerate output: header ``x-demo-reply: loop`` makes every text answer a loop of one word
  cut at max_tokens (finish_reason "length"), as a model stuck in repetition would answer; the
  demo traffic uses it to show the truncated and repetition quality flags. Tool calls are
  unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import math
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .toy_tokenizer import BOS, BYTE_OFFSET, END, ToyTokenizer, canonical_tool_calls, compact_json

MODEL_ID = "claw-demo"
DEFAULT_MAX_TOKENS = 32
MIN_NATURAL, MAX_NATURAL = 12, 40
STREAM_CHUNK_TOKENS = 4
MAX_N = 64
MAX_MODEL_LEN = 131_072
TOOL_ARGUMENTS = '{"x": 1}'
# The placeholder run of each image in the demo's prompt ids (``manage.py serve`` starts the
# demo upstream with ``--image-tokens DEMO_IMAGE_TOKENS``): a VLM server's run is the image's
# patch count (256 for a 448x448 image in Qwen2-VL); the demo's is fixed and short.
DEMO_IMAGE_TOKENS = 16
WORDS = (
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "and",
    "writes",
    "tests",
    "for",
    "it",
    "then",
    "runs",
    "tool",
    "step",
    "reward",
    "claw",
    "tree",
    "token",
    "batch",
    "policy",
    "pool",
    "gateway",
)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_tok = ToyTokenizer()
_JSON_HEADERS = [(b"content-type", b"application/json")]
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
_MODELS_BODY = orjson.dumps(
    {
        "object": "list",
        "data": [
            {
                "id": MODEL_ID,
                "object": "model",
                "created": 0,
                "owned_by": "claw",
                "max_model_len": MAX_MODEL_LEN,
            }
        ],
    }
)


class HttpError(Exception):
    """Raised inside a handler to answer ``status`` with an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def create_app(
    *, latency_ms: float = 0, failure_rate: float = 0.0, token_ids: bool = True, seed: int = 0
) -> ASGIApp:
    """Build the ASGI app. Replies are deterministic given ``seed``; ``failure_rate`` draws from
    a generator seeded with ``seed`` too, so a run's failure pattern is reproducible."""
    fail_rng = random.Random(seed)
    ids_prefix = os.urandom(4).hex()
    counter = itertools.count()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = _headers(scope)
        method, path = scope["method"], scope["path"]
        try:
            delay = latency_ms + _float_header(headers, b"x-demo-delay-ms")
            if delay > 0:
                await asyncio.sleep(delay / 1000)
            forced = headers.get(b"x-demo-fail")
            if forced:
                status = int(forced) if forced.isdigit() else 500
                raise HttpError(status, f"forced failure {status} (x-demo-fail)")
            handler = _ROUTES.get((method, path))
            if handler is None:
                if any(p == path for _, p in _ROUTES):
                    raise HttpError(405, f"method {method} not allowed on {path}")
                raise HttpError(404, f"no route {path}")
            if path in _COMPLETION_PATHS and failure_rate > 0 and fail_rng.random() < failure_rate:
                raise HttpError(500, "random failure (failure_rate)")
            body = await _read_json(receive) if method == "POST" else {}
            ctx = _Ctx(
                token_ids=token_ids,
                seed=seed,
                request_id=f"{ids_prefix}{next(counter):08x}",
                drop=headers.get(b"x-demo-drop", b"") not in (b"", b"0"),
                loop=headers.get(b"x-demo-reply") == b"loop",
            )
            await handler(ctx, body, send)
        except HttpError as e:
            await _send_json(send, e.status, _error_body(e.status, e.message, e.param))

    return app


# --- request context and routing ------------------------------------------------------------
class _Ctx:
    __slots__ = ("token_ids", "seed", "request_id", "drop", "loop", "created")

    def __init__(self, *, token_ids: bool, seed: int, request_id: str, drop: bool, loop: bool = False):
        self.token_ids = token_ids
        self.seed = seed
        self.request_id = request_id
        self.drop = drop
        self.loop = loop
        self.created = int(time.time())


async def _models(ctx: _Ctx, body: dict, send: Send) -> None:
    await _send_raw(send, 200, _MODELS_BODY)


async def _health(ctx: _Ctx, body: dict, send: Send) -> None:
    await _send_raw(send, 200, b"{}")


async def _tokenize(ctx: _Ctx, body: dict, send: Send) -> None:
    if "messages" in body:
        ids = _chat_prompt(body, add_generation_prompt=bool(body.get("add_generation_prompt", True)))
    elif "prompt" in body:
        ids = _text_prompt(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True)))
    else:
        raise HttpError(400, "tokenize needs 'messages' or 'prompt'")
    await _send_json(send, 200, {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids})


async def _detokenize(ctx: _Ctx, body: dict, send: Send) -> None:
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise HttpError(400, "tokens must be an array of integers", param="tokens")
    await _send_json(send, 200, {"prompt": _tok.decode(ids)})


# --- chat completions -------------------------------------------------------------------------
async def _chat(ctx: _Ctx, body: dict, send: Send) -> None:
    prompt = _chat_prompt(body, add_generation_prompt=True)
    opts = _Options(body, ctx, chat=True)
    messages = body["messages"]
    judged = judge_reply(messages)
    if judged is not None:
        choices = [judged] * opts.n
    else:
        tool = _tool_to_call(body.get("tools"), body.get("tool_choice"), messages)
        choices = [
            generate_reply(prompt, ctx.seed, i, opts.max_tokens, tool=tool if i == 0 else None, loop=ctx.loop)
            for i in range(opts.n)
        ]
    if opts.stream:
        await _stream_chat(ctx, send, body, opts, prompt, choices)
        return
    out_choices = []
    for i, c in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": c.content}
        if c.tool_calls:
            message["tool_calls"] = c.tool_calls
        choice: dict[str, Any] = {
            "index": i,
            "message": message,
            "logprobs": {"content": opts.chat_logprobs(c.ids, c.logprobs)} if opts.logprobs else None,
            "finish_reason": c.finish_reason,
        }
        if opts.return_ids:
            choice["token_ids"] = c.ids
        out_choices.append(choice)
    resp: dict[str, Any] = {
        "id": f"chatcmpl-{ctx.request_id}",
        "object": "chat.completion",
        "created": ctx.created,
        "model": body.get("model") or MODEL_ID,
        "choices": out_choices,
        "usage": _usage(prompt, choices),
    }
    if opts.return_ids:
        resp["prompt_token_ids"] = prompt
    await _send_json(send, 200, resp, drop=ctx.drop)


async def _stream_chat(
    ctx: _Ctx, send: Send, body: dict, opts: _Options, prompt: list[int], choices: list[DemoReply]
) -> None:
    base = {
        "id": f"chatcmpl-{ctx.request_id}",
        "object": "chat.completion.chunk",
        "created": ctx.created,
        "model": body.get("model") or MODEL_ID,
    }
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    # Like vLLM: one role chunk per choice, each carrying prompt_token_ids when asked.
    for i in range(len(choices)):
        first: dict[str, Any] = {
            **base,
            "choices": [
                {
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if opts.return_ids:
            first["prompt_token_ids"] = prompt
        await _send_event(send, first)
        if ctx.drop:
            return  # the connection closes mid-stream (uvicorn closes an unfinished response)
    plans = [_chat_stream_plan(c) for c in choices]
    for round_ in range(max(len(p) for p in plans)):
        for i, plan in enumerate(plans):
            if round_ >= len(plan):
                continue
            delta, ids, lps, finish = plan[round_]
            choice: dict[str, Any] = {
                "index": i,
                "delta": delta,
                "logprobs": {"content": opts.chat_logprobs(ids, lps)} if opts.logprobs else None,
                "finish_reason": finish,
            }
            if opts.return_ids:
                choice["token_ids"] = ids
            await _send_event(send, {**base, "choices": [choice]})
    if opts.include_usage:
        await _send_event(send, {**base, "choices": [], "usage": _usage(prompt, choices)})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _chat_stream_plan(c: DemoReply) -> list[tuple[dict, list[int], list[float], str | None]]:
    """Split one choice into stream deltas: (delta, token id delta, logprob delta, finish)."""
    if c.tool_calls:
        call = c.tool_calls[0]
        args = call["function"]["arguments"]
        deltas: list[dict] = [
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        ]
        deltas += [
            {"tool_calls": [{"index": 0, "function": {"arguments": args[k : k + 3]}}]}
            for k in range(0, len(args), 3)
        ]
        deltas.append({})
        bounds = _split_bounds(len(c.ids), len(deltas))
        return [
            (d, c.ids[a:b], c.logprobs[a:b], "tool_calls" if j == len(deltas) - 1 else None)
            for j, (d, (a, b)) in enumerate(zip(deltas, bounds, strict=True))
        ]
    plan = []
    n = len(c.ids)
    for a in range(0, n, STREAM_CHUNK_TOKENS):
        b = min(a + STREAM_CHUNK_TOKENS, n)
        plan.append(
            (
                {"content": _tok.decode(c.ids[a:b])},
                c.ids[a:b],
                c.logprobs[a:b],
                c.finish_reason if b == n else None,
            )
        )
    return plan


def _split_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering [0, n) as evenly as possible."""
    step, extra = divmod(n, parts)
    out, a = [], 0
    for j in range(parts):
        b = a + step + (1 if j < extra else 0)
        out.append((a, b))
        a = b
    return out


# --- Anthropic Messages (for the gateway's passthrough mode) -------------------------------------
async def _messages(ctx: _Ctx, body: dict, send: Send) -> None:
    """A minimal Messages server, as vLLM's own /v1/messages is: no token ids. Text and
    tool_use replies, streamed or not; the reply is the chat reply to the same conversation."""
    chat: list[dict[str, Any]] = []
    if isinstance(body.get("system"), str):
        chat.append({"role": "system", "content": body["system"]})
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = "".join(b.get("text") or "" for b in content if isinstance(b, dict))
        chat.append({"role": m.get("role") if isinstance(m, dict) else "user", "content": content or ""})
    tools = [{"type": "function", "function": {"name": t.get("name")}} for t in body.get("tools") or ()]
    prompt = _chat_prompt({"messages": chat, "tools": tools or None}, add_generation_prompt=True)
    tool = _tool_to_call(tools, None, chat)
    reply = generate_reply(prompt, ctx.seed, 0, body.get("max_tokens"), tool=tool, loop=ctx.loop)
    if reply.tool_calls:
        call = reply.tool_calls[0]
        block: dict[str, Any] = {
            "type": "tool_use",
            "id": call["id"],
            "name": call["function"]["name"],
            "input": orjson.loads(call["function"]["arguments"]),
        }
    else:
        block = {"type": "text", "text": reply.content or ""}
    stop = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}[reply.finish_reason]
    message = {
        "id": f"msg_{ctx.request_id}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model") or MODEL_ID,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": len(prompt), "output_tokens": len(reply.ids)},
    }
    if not body.get("stream"):
        await _send_json(send, 200, message)
        return
    await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    head = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": len(prompt), "output_tokens": 0},
    }
    events: list[tuple[str, dict]] = [("message_start", {"type": "message_start", "message": head})]
    if block["type"] == "text":
        start, deltas = (
            {"type": "text", "text": ""},
            [
                {"type": "text_delta", "text": _tok.decode(reply.ids[a : a + STREAM_CHUNK_TOKENS])}
                for a in range(0, len(reply.ids), STREAM_CHUNK_TOKENS)
            ],
        )
    else:
        args = reply.tool_calls[0]["function"]["arguments"]  # type: ignore[index]
        start = {**block, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": args[k : k + 3]} for k in range(0, len(args), 3)
        ]
    events.append(
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start})
    )
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": len(reply.ids)},
            },
        )
    )
    for name, payload in events:
        frame = b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
        await send({"type": "http.response.body", "body": frame, "more_body": True})
        if ctx.drop:
            return
    stop_frame = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    await send({"type": "http.response.body", "body": stop_frame, "more_body": False})


# --- text completions -------------------------------------------------------------------------
async def _completions(ctx: _Ctx, body: dict, send: Send) -> None:
    if "prompt" not in body:
        raise HttpError(400, "prompt is required", param="prompt")
    prompt = _text_prompt(body["prompt"], add_special_tokens=True)
    opts = _Options(body, ctx, chat=False)
    choices = [
        generate_reply(prompt, ctx.seed, i, opts.max_tokens, tool=None, loop=ctx.loop) for i in range(opts.n)
    ]
    base = {
        "id": f"cmpl-{ctx.request_id}",
        "object": "text_completion",
        "created": ctx.created,
        "model": body.get("model") or MODEL_ID,
    }
    if opts.stream:
        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
        plans = [_split_bounds(len(c.ids), max(1, -(-len(c.ids) // STREAM_CHUNK_TOKENS))) for c in choices]
        offsets = [0] * len(choices)  # text_offset runs on across a choice's chunks
        for round_ in range(max(len(p) for p in plans)):
            for i, (c, plan) in enumerate(zip(choices, plans, strict=True)):
                if round_ >= len(plan):
                    continue
                a, b = plan[round_]
                ids = c.ids[a:b]
                choice: dict[str, Any] = {
                    "index": i,
                    "text": _tok.decode(ids),
                    "logprobs": (
                        opts.completion_logprobs(ids, c.logprobs[a:b], start=offsets[i])
                        if opts.logprobs
                        else None
                    ),
                    "finish_reason": c.finish_reason if b == len(c.ids) else None,
                }
                offsets[i] += sum(len(_tok.decode([t])) for t in ids)
                if opts.return_ids:
                    if round_ == 0:
                        choice["prompt_token_ids"] = prompt
                    choice["token_ids"] = ids
                await _send_event(send, {**base, "choices": [choice]})
                if ctx.drop:
                    return
        if opts.include_usage:
            await _send_event(send, {**base, "choices": [], "usage": _usage(prompt, choices)})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})
        return
    out = []
    for i, c in enumerate(choices):
        choice = {
            "index": i,
            "text": c.content or "",
            "logprobs": opts.completion_logprobs(c.ids, c.logprobs) if opts.logprobs else None,
            "finish_reason": c.finish_reason,
        }
        if opts.return_ids:
            choice["prompt_token_ids"] = prompt
            choice["token_ids"] = c.ids
        out.append(choice)
    await _send_json(send, 200, {**base, "choices": out, "usage": _usage(prompt, choices)}, drop=ctx.drop)


# --- generation ---------------------------------------------------------------------------------
class DemoReply:
    """One generated choice: response ids (ending in <|end|> unless cut), one logprob per id,
    the text (None for a tool call), the tool calls, and the finish reason."""

    __slots__ = ("ids", "logprobs", "content", "tool_calls", "finish_reason")

    def __init__(
        self,
        ids: list[int],
        logprobs: list[float],
        content: str | None,
        tool_calls: list[dict] | None,
        finish_reason: str,
    ):
        self.ids = ids
        self.logprobs = logprobs
        self.content = content
        self.tool_calls = tool_calls
        self.finish_reason = finish_reason


def generate_reply(
    prompt: list[int], seed: int, index: int, max_tokens: int | None, *, tool: str | None, loop: bool = False
) -> DemoReply:
    """The deterministic reply for (prompt, seed, index, max_tokens); see the module docstring.
    ``tool`` names a function to call instead of answering text; ``loop`` makes a text answer
    degenerate (one word repeated up to max_tokens, finish_reason "length"). Pure: no I/O, no
    state."""
    # orjson serialises a long int list ~10x faster than array("i", ...) converts it.
    dumped = orjson.dumps(prompt)
    if tool is None and _REPLY_NEEDLE in dumped:  # a C substring search: free when absent
        scripted = _scripted_reply(prompt, max_tokens)
        if scripted is not None:
            return scripted
    h = hashlib.blake2b(dumped, digest_size=16)
    h.update(seed.to_bytes(8, "little", signed=True))
    h.update(index.to_bytes(4, "little"))
    digest = h.digest()
    rng = random.Random(digest)
    if tool is not None:
        calls = [
            {
                "id": f"call_{digest.hex()[:24]}",
                "type": "function",
                "function": {"name": tool, "arguments": TOOL_ARGUMENTS},
            }
        ]
        ids = _tok.encode(compact_json(canonical_tool_calls(calls))) + [END]
        return DemoReply(ids, _logprobs(rng, len(ids)), None, calls, "tool_calls")
    budget = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
    if loop:
        # A period of at most 8 byte tokens: few distinct 4-grams, so pool/quality.py flags
        # it as repetition from 32 tokens on (its minimum length).
        word = WORDS[rng.randrange(len(WORDS))] + " "
        ids = _tok.encode(word * (budget // len(word) + 1))[:budget]
        return DemoReply(ids, _logprobs(rng, len(ids)), _tok.decode(ids), None, "length")
    natural = rng.randint(MIN_NATURAL, MAX_NATURAL)
    words: list[str] = []
    length = -1
    while length < natural:
        w = WORDS[rng.randrange(len(WORDS))]
        words.append(w)
        length += len(w) + 1
    text = " ".join(words)
    text = text[0].upper() + text[1 : natural - 1] + "."
    ids = _tok.encode(text)
    if natural + 1 <= budget:
        ids.append(END)
        finish = "stop"
    else:
        ids = ids[:budget]
        finish = "length"
    return DemoReply(ids, _logprobs(rng, len(ids)), _tok.decode(ids), None, finish)


REPLY_MARKER = "[demo-reply]"
_REPLY_IDS = _tok.encode(REPLY_MARKER)
_REPLY_NEEDLE = b"," + ",".join(map(str, _REPLY_IDS)).encode() + b","
JUDGE_MARKER = "[claw-judge]"  # pool/rewards/judge.py's system prompt starts with it


def _scripted_reply(prompt: list[int], max_tokens: int | None) -> DemoReply | None:
    """The text after the prompt's last REPLY_MARKER, to the end of its message."""
    n = len(_REPLY_IDS)
    start = next(
        (i + n for i in range(len(prompt) - n, -1, -1) if prompt[i : i + n] == _REPLY_IDS),
        None,
    )
    if start is None:
        return None
    end = start
    while end < len(prompt) and BYTE_OFFSET <= prompt[end] < BYTE_OFFSET + 256:
        end += 1
    text = _tok.decode(prompt[start:end])
    ids = [*_tok.encode(text), END]
    budget = max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS
    finish = "stop"
    if len(ids) > budget:
        ids, finish = ids[:budget], "length"
    rng = random.Random(orjson.dumps(prompt))
    return DemoReply(ids, _logprobs(rng, len(ids)), _tok.decode(ids), None, finish)


_ROLLOUT = re.compile(r'<rollout id="([^"]+)">\n(.*?)\n</rollout>', re.DOTALL)
_REFERENCE = re.compile(r"<reference>(.*?)</reference>", re.DOTALL)


def judge_reply(messages: list) -> DemoReply | None:
    """The deterministic judge answer (see the module docstring) when a system message
    carries JUDGE_MARKER; None otherwise."""
    system = [
        m.get("content")
        for m in messages
        if isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str)
    ]
    if not any(JUDGE_MARKER in c for c in system):
        return None
    user = "\n".join(
        m["content"]
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
    )
    ref = _REFERENCE.search(user)
    reference = ref.group(1).strip() if ref else ""
    rollouts = _ROLLOUT.findall(user)
    longest = max((len(text) for _, text in rollouts), default=0) or 1
    scores = []
    for rid, text in rollouts:
        if reference:
            hit = re.search(r"(?<![\w.])" + re.escape(reference) + r"(?![\w])", text) is not None
            score, why = (1.0, "matches the reference") if hit else (0.0, "does not match the reference")
        else:
            score, why = round(len(text) / longest, 3), "relative length"
        scores.append({"trajectory_id": rid, "explanation": why, "score": score})
    content = compact_json({"scores": scores})
    ids = [*_tok.encode(content), END]
    return DemoReply(ids, _logprobs(random.Random(content), len(ids)), content, None, "stop")


def _logprobs(rng: random.Random, n: int) -> list[float]:
    # -5 * (1 - u) for u in [0, 1) lies in [-5, 0).
    r = rng.random
    return [-5.0 * (1.0 - r()) for _ in range(n)]


def _top(token_id: int, logprob: float, k: int) -> list[tuple[int, float]]:
    """The k "most likely" tokens at a position, made up: the sampled one, and k - 1 other
    byte tokens sharing the probability left, (1 - p) / 2, (1 - p) / 4, ...; most likely first."""
    if k <= 0:
        return []
    rest = math.log(-math.expm1(logprob))  # log(1 - p), finite for any logprob < 0
    others = [(BYTE_OFFSET + (token_id - BYTE_OFFSET + j) % 256, rest - j * _LN2) for j in range(1, k)]
    return sorted([(token_id, logprob), *others], key=lambda e: -e[1])


_LN2 = math.log(2.0)
MAX_TOP_LOGPROBS = 20  # vLLM's default --max-logprobs


def _tool_to_call(tools: Any, tool_choice: Any, messages: list) -> str | None:
    if not tools or tool_choice == "none":
        return None
    if not messages or not isinstance(messages[-1], dict) or messages[-1].get("role") != "user":
        return None
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        if name:
            return name
    first = tools[0] if isinstance(tools, list) else None
    name = ((first or {}).get("function") or {}).get("name") if isinstance(first, dict) else None
    if not isinstance(name, str):
        raise HttpError(400, "tools[0].function.name is required", param="tools")
    return name


class _Options:
    """The sampling-independent options of a completion request, validated."""

    __slots__ = ("n", "max_tokens", "stream", "include_usage", "logprobs", "top", "return_ids", "as_ids")

    def __init__(self, body: dict, ctx: _Ctx, *, chat: bool):
        n = body.get("n", 1)
        if n is None:
            n = 1
        if type(n) is not int or not 1 <= n <= MAX_N:
            raise HttpError(400, f"n must be an integer in [1, {MAX_N}]", param="n")
        self.n = n
        mt = body.get("max_completion_tokens", body.get("max_tokens"))
        if mt is not None and (type(mt) is not int or mt < 1):
            raise HttpError(400, "max_tokens must be a positive integer", param="max_tokens")
        self.max_tokens = mt
        self.stream = bool(body.get("stream"))
        self.include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        lp = body.get("logprobs")
        self.logprobs = lp is not None and lp is not False
        # Alternatives per token: chat top_logprobs; completions logprobs (an integer).
        name, top = ("top_logprobs", body.get("top_logprobs")) if chat else ("logprobs", lp)
        if top is None or type(top) is bool:
            top = 0
        if self.logprobs and (type(top) is not int or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise HttpError(400, f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}]", param=name)
        self.top = top
        self.return_ids = ctx.token_ids and bool(body.get("return_token_ids"))
        self.as_ids = ctx.token_ids and bool(body.get("return_tokens_as_token_ids"))

    def token_label(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.as_ids else _tok.token_text(token_id)

    def chat_logprobs(self, ids: list[int], lps: list[float]) -> list[dict]:
        label, raw, k = self.token_label, _tok.token_bytes, self.top
        return [
            {
                "token": label(t),
                "logprob": lp,
                "bytes": raw(t),
                "top_logprobs": [
                    {"token": label(a), "logprob": alp, "bytes": raw(a)} for a, alp in _top(t, lp, k)
                ],
            }
            for t, lp in zip(ids, lps, strict=True)
        ]

    def completion_logprobs(self, ids: list[int], lps: list[float], *, start: int = 0) -> dict:
        """``start``: the text offset of ids[0] in the reply (a stream's later chunks)."""
        label, k = self.token_label, max(self.top, 1)
        offsets, pos = [], start
        for t in ids:
            offsets.append(pos)
            pos += len(_tok.decode([t]))
        return {
            "tokens": [label(t) for t in ids],
            "token_logprobs": lps,
            "top_logprobs": [
                {label(a): alp for a, alp in _top(t, lp, k)} for t, lp in zip(ids, lps, strict=True)
            ],
            "text_offset": offsets,
        }


def _usage(prompt: list[int], choices: list[DemoReply]) -> dict[str, int]:
    completion = sum(len(c.ids) for c in choices)
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": completion,
        "total_tokens": len(prompt) + completion,
    }


def _chat_prompt(body: dict, *, add_generation_prompt: bool) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "messages must be a non-empty array", param="messages")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise HttpError(400, "tools must be an array", param="tools")
    try:
        return _tok.apply_chat_template(messages, tools, add_generation_prompt=add_generation_prompt)
    except ValueError as e:
        raise HttpError(400, str(e), param="messages") from None


def _text_prompt(prompt: Any, *, add_special_tokens: bool) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        ids = _tok.encode(prompt)
        return [BOS, *ids] if add_special_tokens else ids
    if (
        isinstance(prompt, list)
        and prompt
        and all(type(i) is int and 0 <= i < _tok.vocab_size for i in prompt)
    ):
        return list(prompt)
    raise HttpError(
        400,
        "prompt must be a string or a non-empty array of token ids (batches are not supported)",
        param="prompt",
    )


# --- ASGI plumbing ------------------------------------------------------------------------------
_ROUTES: dict[tuple[str, str], Callable[[_Ctx, dict, Send], Awaitable[None]]] = {
    ("GET", "/v1/models"): _models,
    ("GET", "/health"): _health,
    ("POST", "/v1/chat/completions"): _chat,
    ("POST", "/v1/completions"): _completions,
    ("POST", "/v1/messages"): _messages,
    ("POST", "/tokenize"): _tokenize,
    ("POST", "/detokenize"): _detokenize,
}
_COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope["headers"]}


def _float_header(headers: dict[bytes, bytes], name: bytes) -> float:
    raw = headers.get(name)
    if not raw:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise HttpError(400, f"{name.decode()} must be a number") from None


async def _read_json(receive: Receive) -> dict:
    chunks = []
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise HttpError(499, "client disconnected")
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    raw = b"".join(chunks)
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        raise HttpError(400, "body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HttpError(400, "body must be a JSON object")
    return body


def _error_body(status: int, message: str, param: str | None) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status in (401, 403):
        kind = "authentication_error" if status == 401 else "permission_error"
    elif status == 404:
        kind = "not_found_error"
    elif status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": str(status)}}


async def _send_json(send: Send, status: int, payload: Any, *, drop: bool = False) -> None:
    await _send_raw(send, status, orjson.dumps(payload), drop=drop)


async def _send_raw(send: Send, status: int, body: bytes, *, drop: bool = False) -> None:
    headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    if drop:
        # Half the body, then return: the server closes the connection on an unfinished response.
        await send({"type": "http.response.body", "body": body[: len(body) // 2], "more_body": True})
        return
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_event(send: Send, payload: dict) -> None:
    await send(
        {"type": "http.response.body", "body": b"data: " + orjson.dumps(payload) + b"\n\n", "more_body": True}
    )


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


# --- CLI ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None, *, wrap: Callable[[Any], Any] | None = None) -> None:
    """``python -m claw_site.demo.upstream --port N``: serve the demo upstream with uvicorn.

    ``--fd N`` serves on an inherited listening socket instead; ``wrap`` wraps the app (the
    gateway tests add their hooks, tests/gateway/upstream_harness.py)."""
    import uvicorn

    p = argparse.ArgumentParser(description="Claw-R1 demo upstream (answers like vLLM, no model).")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--fd", type=int, default=None, help="serve on this inherited listening socket")
    p.add_argument("--latency-ms", type=float, default=0.0, help="added to every request")
    p.add_argument(
        "--failure-rate", type=float, default=0.0, help="share of completion requests answered 500"
    )
    p.add_argument(
        "--no-token-ids", action="store_true", help="ignore return_token_ids (a plain OpenAI server)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--image-tokens",
        type=int,
        default=int(os.environ.get("CLAW_DEMO_IMAGE_TOKENS", "0")),
        help="render each image part as this many placeholder ids (151655, as a VLM server's <|image_pad|>)",
    )
    args = p.parse_args(argv)
    _tok.image_tokens = args.image_tokens
    app = create_app(
        latency_ms=args.latency_ms,
        failure_rate=args.failure_rate,
        token_ids=not args.no_token_ids,
        seed=args.seed,
    )
    uvicorn.run(
        wrap(app) if wrap is not None else app,
        host=args.host,
        port=args.port,
        fd=args.fd,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        lifespan="off",
        access_log=False,
    )


if __name__ == "__main__":
    main()
