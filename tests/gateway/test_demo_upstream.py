"""The demo upstream answers like vLLM: checked with the official `openai` client over real HTTP."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import openai
import pytest

from claw_site.demo.toy_tokenizer import BOS, END, ToyTokenizer, canonical_tool_calls
from pool.quality import is_repetitive
from tests.live import stop_process

from .conftest import start_upstream

TOK = ToyTokenizer()
IDS = {"return_token_ids": True}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "run a command",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="any-key-is-accepted", max_retries=0, timeout=10)


def tokenize(base: str, **body) -> list[int]:
    r = httpx.post(base.removesuffix("/v1") + "/tokenize", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["count"] == len(data["tokens"])
    return data["tokens"]


# --- toy tokenizer --------------------------------------------------------------------------------
def test_toy_tokenizer_round_trips_any_text_and_skips_specials():
    # given text with multi-byte characters
    text = "héllo ✓ 𝄞 \x00 end"
    # when encoded and decoded (with specials mixed in)
    ids = TOK.encode(text)
    # then it round-trips, every id is a byte id, and specials are skipped
    assert TOK.decode(ids) == text
    assert all(3 <= i <= 258 for i in ids)
    assert TOK.decode([BOS, *ids, END]) == text
    assert TOK.vocab_size == 265


def test_toy_template_is_append_only_even_when_tool_calls_come_back_reordered():
    # given a conversation, the generation prompt, and a reply with a tool call
    tools = TOOLS
    prompt = TOK.apply_chat_template(MESSAGES, tools)
    call = {"id": "call_1", "type": "function", "function": {"name": "run_shell", "arguments": '{"x": 1}'}}
    from claw_site.demo.toy_tokenizer import compact_json

    generated = TOK.encode(compact_json(canonical_tool_calls([call]))) + [END]
    # when the agent echoes the call back with extra keys in another order, plus an observation
    echoed = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "function": {"arguments": '{"x": 1}', "name": "run_shell"},
                "type": "function",
                "id": "call_1",
                "index": 0,
            }
        ],
    }
    nxt = TOK.apply_chat_template([*MESSAGES, echoed, {"role": "tool", "content": "ok"}], tools)
    # then the next prompt extends prompt + generated ids exactly
    assert nxt[: len(prompt) + len(generated)] == prompt + generated
    assert prompt[0] == BOS and prompt[-1] == 261


def test_toy_template_rejects_unknown_roles():
    with pytest.raises(ValueError, match="unknown role"):
        TOK.apply_chat_template([{"role": "wizard", "content": "x"}])


# --- chat completions -----------------------------------------------------------------------------
def test_models_lists_claw_demo(demo_upstream):
    models = client(demo_upstream).models.list()
    assert [m.id for m in models.data] == ["claw-demo"]


def test_chat_returns_vllm_token_ids_and_is_deterministic(demo_upstream):
    c = client(demo_upstream)
    # when the same request is sent twice with n=2 and return_token_ids
    r1 = c.chat.completions.create(model="claw-demo", messages=MESSAGES, n=2, max_tokens=64, extra_body=IDS)
    r2 = c.chat.completions.create(model="claw-demo", messages=MESSAGES, n=2, max_tokens=64, extra_body=IDS)
    # then prompt ids are the chat template's (the same as /tokenize gives)
    assert (
        r1.prompt_token_ids == TOK.apply_chat_template(MESSAGES) == tokenize(demo_upstream, messages=MESSAGES)
    )
    # and each choice's ids decode to its content, end with <|end|>, and are counted in usage
    assert len(r1.choices) == 2
    for ch in r1.choices:
        assert ch.finish_reason == "stop"
        assert ch.token_ids[-1] == END
        assert TOK.decode(ch.token_ids) == ch.message.content
        assert 12 <= len(ch.token_ids) - 1 <= 40
    assert r1.choices[0].token_ids != r1.choices[1].token_ids
    assert r1.usage.prompt_tokens == len(r1.prompt_token_ids)
    assert r1.usage.completion_tokens == sum(len(ch.token_ids) for ch in r1.choices)
    assert r1.usage.total_tokens == r1.usage.prompt_tokens + r1.usage.completion_tokens
    # and the reply is a pure function of the request
    assert [ch.token_ids for ch in r2.choices] == [ch.token_ids for ch in r1.choices]


def test_max_tokens_cuts_the_reply_with_finish_reason_length(demo_upstream):
    r = client(demo_upstream).chat.completions.create(
        model="claw-demo", messages=MESSAGES, max_tokens=5, extra_body=IDS
    )
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    assert len(ch.token_ids) == 5 and END not in ch.token_ids
    assert r.usage.completion_tokens == 5


def test_logprobs_one_per_response_id_optionally_as_token_ids(demo_upstream):
    c = client(demo_upstream)
    # when logprobs are asked with tokens rendered as ids
    r = c.chat.completions.create(
        model="claw-demo",
        messages=MESSAGES,
        logprobs=True,
        max_tokens=64,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    ch = r.choices[0]
    # then there is one entry per response id, labelled token_id:N, with a value in [-5, 0)
    assert [e.token for e in ch.logprobs.content] == [f"token_id:{t}" for t in ch.token_ids]
    assert all(-5 <= e.logprob < 0 for e in ch.logprobs.content)
    # and without the label option the tokens are the decoded text
    plain = c.chat.completions.create(model="claw-demo", messages=MESSAGES, logprobs=True, max_tokens=64)
    entries = plain.choices[0].logprobs.content
    assert "".join(e.token for e in entries[:-1]) == plain.choices[0].message.content
    assert [e.logprob for e in entries] == [e.logprob for e in ch.logprobs.content]


def test_top_logprobs_alternatives_and_offsets_are_the_same_streamed_or_not(demo_upstream):
    c = client(demo_upstream)
    # given: chat asking 3 alternatives per token, and completions asking logprobs 3
    chat = dict(model="claw-demo", messages=MESSAGES, logprobs=True, top_logprobs=3, max_tokens=64)
    cmpl = dict(model="claw-demo", prompt="Once upon", logprobs=3, max_tokens=30)

    # when: each is asked whole and streamed
    whole = c.chat.completions.create(**chat).choices[0].logprobs.content
    streamed = [
        e
        for chunk in c.chat.completions.create(**chat, stream=True)
        for ch in chunk.choices
        if ch.logprobs
        for e in ch.logprobs.content
    ]
    whole_c = c.completions.create(**cmpl).choices[0].logprobs
    streamed_c = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in c.completions.create(**cmpl, stream=True):
        for k, v in streamed_c.items():
            v += getattr(chunk.choices[0].logprobs, k)

    # then: the same entries either way
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in whole]
    assert streamed_c == whole_c.model_dump()
    # and: each chat entry has 3 alternatives, most likely first, one of them the sampled token
    for e in whole:
        alts = e.top_logprobs
        assert len(alts) == 3 and [a.logprob for a in alts] == sorted((a.logprob for a in alts), reverse=True)
        assert (e.token, e.logprob) in [(a.token, a.logprob) for a in alts]
        assert all(a.logprob < 0 for a in alts)
    # and: completions offsets run on from the start of the reply, the sampled token in each top
    text = c.completions.create(**cmpl).choices[0].text
    assert whole_c.text_offset[0] == 0 and whole_c.text_offset == sorted(whole_c.text_offset)
    assert whole_c.text_offset[-1] < len(text) + 1
    for tok, lp, top in zip(whole_c.tokens, whole_c.token_logprobs, whole_c.top_logprobs, strict=True):
        assert top[tok] == lp and 1 <= len(top) <= 3


def test_tool_call_reply_and_multi_turn_prompts_extend_without_drift(demo_upstream):
    c = client(demo_upstream)
    messages = list(MESSAGES)
    # given a 3-turn agent with a tool that appends each reply and a tool observation
    prev_full: list[int] | None = None
    for turn in range(3):
        r = c.chat.completions.create(
            model="claw-demo", messages=messages, tools=TOOLS, max_tokens=64, extra_body=IDS
        )
        ch = r.choices[0]
        prompt = r.prompt_token_ids
        # then each prompt starts with the previous prompt + response ids (append-only, no drift)
        if prev_full is not None:
            assert prompt[: len(prev_full)] == prev_full
        if turn == 0 or messages[-1]["role"] == "user":
            # the last message is the user's: choice 0 calls the first tool
            assert ch.finish_reason == "tool_calls" and ch.message.content is None
            call = ch.message.tool_calls[0]
            assert call.id.startswith("call_") and call.function.name == "run_shell"
            assert json.loads(call.function.arguments) == {"x": 1}
            assert TOK.decode(ch.token_ids) == json.dumps(
                canonical_tool_calls([call.model_dump()]), separators=(",", ":"), sort_keys=True
            )
        assert ch.token_ids[-1] == END
        prev_full = prompt + ch.token_ids
        messages.append(ch.message.model_dump(exclude_none=True))
        if ch.message.tool_calls:
            messages.append(
                {"role": "tool", "tool_call_id": ch.message.tool_calls[0].id, "content": "exit 0"}
            )
        else:
            messages.append({"role": "user", "content": "go on"})
    assert tokenize(demo_upstream, messages=messages, tools=TOOLS)[: len(prev_full)] == prev_full


def test_tool_choice_none_answers_text(demo_upstream):
    r = client(demo_upstream).chat.completions.create(
        model="claw-demo", messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=64
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


async def test_async_streaming_matches_non_streaming(demo_upstream):
    c = openai.AsyncOpenAI(base_url=demo_upstream, api_key="k", max_retries=0)
    body = dict(model="claw-demo", messages=MESSAGES, n=2, max_tokens=64, logprobs=True, extra_body=IDS)
    # given the non-streamed answer
    full = await c.chat.completions.create(**body)
    # when the same request is streamed with usage
    stream = await c.chat.completions.create(**body, stream=True, stream_options={"include_usage": True})
    ids: dict[int, list[int]] = {0: [], 1: []}
    text: dict[int, str] = {0: "", 1: ""}
    lps: dict[int, list[float]] = {0: [], 1: []}
    prompt_ids, finish, usage, roles = None, {}, None, set()
    async for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        if getattr(chunk, "prompt_token_ids", None) is not None:
            prompt_ids = chunk.prompt_token_ids
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.add(ch.index)
            ids[ch.index] += getattr(ch, "token_ids", None) or []
            text[ch.index] += ch.delta.content or ""
            if ch.logprobs:
                lps[ch.index] += [e.logprob for e in ch.logprobs.content]
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    await c.close()
    # then the deltas add up to the non-streamed ids, text and logprobs
    assert roles == {0, 1}
    assert prompt_ids == full.prompt_token_ids
    for i in (0, 1):
        assert ids[i] == full.choices[i].token_ids
        assert text[i] == full.choices[i].message.content
        assert lps[i] == [e.logprob for e in full.choices[i].logprobs.content]
        assert finish[i] == full.choices[i].finish_reason
    assert usage is not None and usage.total_tokens == full.usage.total_tokens


def test_streamed_tool_call_reassembles_like_openai(demo_upstream):
    c = client(demo_upstream)
    full = c.chat.completions.create(model="claw-demo", messages=MESSAGES, tools=TOOLS, extra_body=IDS)
    name, args, call_id, ids, finish = "", "", None, [], None
    for chunk in c.chat.completions.create(
        model="claw-demo", messages=MESSAGES, tools=TOOLS, stream=True, extra_body=IDS
    ):
        for ch in chunk.choices:
            ids += getattr(ch, "token_ids", None) or []
            for tc in ch.delta.tool_calls or []:
                call_id = tc.id or call_id
                name += (tc.function.name or "") if tc.function else ""
                args += (tc.function.arguments or "") if tc.function else ""
            finish = ch.finish_reason or finish
    want = full.choices[0].message.tool_calls[0]
    assert (call_id, name, args) == (want.id, want.function.name, want.function.arguments)
    assert ids == full.choices[0].token_ids and finish == "tool_calls"


# --- completions and tokenize ---------------------------------------------------------------------
def test_completions_return_ids_on_each_choice_streamed_or_not(demo_upstream):
    c = client(demo_upstream)
    r = c.completions.create(model="claw-demo", prompt="Once upon", max_tokens=64, n=2, extra_body=IDS)
    want_prompt = [BOS, *TOK.encode("Once upon")]
    assert want_prompt == tokenize(demo_upstream, prompt="Once upon")
    for ch in r.choices:
        assert ch.prompt_token_ids == want_prompt
        assert TOK.decode(ch.token_ids) == ch.text
    ids: dict[int, list[int]] = {0: [], 1: []}
    prompts = {}
    for chunk in c.completions.create(
        model="claw-demo", prompt="Once upon", max_tokens=64, n=2, stream=True, extra_body=IDS
    ):
        for ch in chunk.choices:
            ids[ch.index] += ch.token_ids
            if getattr(ch, "prompt_token_ids", None):
                prompts[ch.index] = ch.prompt_token_ids
    assert [ids[0], ids[1]] == [ch.token_ids for ch in r.choices]
    assert prompts == {0: want_prompt, 1: want_prompt}
    # and a prompt given as ids is used as is
    by_ids = c.completions.create(model="claw-demo", prompt=want_prompt, max_tokens=64, extra_body=IDS)
    assert by_ids.choices[0].token_ids == r.choices[0].token_ids


# --- faults ---------------------------------------------------------------------------------------
def test_fault_headers_force_status_delay_and_drop(demo_upstream):
    c = client(demo_upstream)
    # x-demo-fail answers that status with an OpenAI error body
    with pytest.raises(openai.RateLimitError) as e:
        c.chat.completions.create(model="claw-demo", messages=MESSAGES, extra_headers={"x-demo-fail": "429"})
    assert e.value.status_code == 429 and "forced failure" in e.value.message
    with pytest.raises(openai.InternalServerError) as e:
        c.chat.completions.create(model="claw-demo", messages=MESSAGES, extra_headers={"x-demo-fail": "503"})
    assert e.value.status_code == 503
    # x-demo-delay-ms adds latency
    t0 = time.perf_counter()
    c.chat.completions.create(model="claw-demo", messages=MESSAGES, extra_headers={"x-demo-delay-ms": "250"})
    assert time.perf_counter() - t0 >= 0.25
    # x-demo-drop closes the connection mid-response, streamed or not
    with pytest.raises(openai.APIConnectionError):
        c.chat.completions.create(model="claw-demo", messages=MESSAGES, extra_headers={"x-demo-drop": "1"})
    with pytest.raises((openai.APIConnectionError, httpx.HTTPError)):
        for _ in c.chat.completions.create(
            model="claw-demo", messages=MESSAGES, stream=True, extra_headers={"x-demo-drop": "1"}
        ):
            pass
    # and the server is still fine afterwards
    assert c.chat.completions.create(model="claw-demo", messages=MESSAGES).choices[0].message.content


def test_reply_loop_header_makes_text_answers_degenerate(demo_upstream):
    c = client(demo_upstream)
    loop = {"x-demo-reply": "loop"}
    # x-demo-reply: loop answers text as one word repeated up to max_tokens, cut ("length")
    r = c.chat.completions.create(
        model="claw-demo", messages=MESSAGES, max_tokens=40, extra_headers=loop, extra_body=IDS
    )
    choice = r.choices[0]
    assert choice.finish_reason == "length" and len(choice.token_ids) == 40
    assert len(set(choice.message.content.split())) == 1
    # which pool/quality.py flags as repetition
    assert is_repetitive(np.array(choice.token_ids))
    # and text completions too
    t = c.completions.create(model="claw-demo", prompt="hi", max_tokens=40, extra_headers=loop)
    assert t.choices[0].finish_reason == "length" and len(set(t.choices[0].text.split())) == 1
    # while a tool call is unchanged, and without the header answers are natural
    tool = c.chat.completions.create(model="claw-demo", messages=MESSAGES, tools=TOOLS, extra_headers=loop)
    assert tool.choices[0].finish_reason == "tool_calls"
    plain = c.chat.completions.create(model="claw-demo", messages=MESSAGES, max_tokens=40)
    assert plain.choices[0].finish_reason == "stop"


def test_bad_requests_get_openai_error_bodies(demo_upstream):
    root = demo_upstream.removesuffix("/v1")
    r = httpx.post(
        f"{demo_upstream}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(f"{demo_upstream}/chat/completions", json={"messages": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    assert (
        httpx.post(f"{demo_upstream}/chat/completions", json={"messages": MESSAGES, "n": 0}).status_code
        == 400
    )
    assert httpx.get(f"{root}/nope").status_code == 404
    assert httpx.get(f"{demo_upstream}/chat/completions").status_code == 405


def test_failure_rate_gives_some_random_500s():
    base, proc = start_upstream("--failure-rate", "0.5", "--seed", "3")
    try:
        codes = [
            httpx.post(f"{base}/chat/completions", json={"messages": MESSAGES}).status_code for _ in range(30)
        ]
        assert set(codes) == {200, 500}
        assert httpx.get(f"{base}/models").status_code == 200  # /v1/models never fails randomly
    finally:
        stop_process(proc)


# --- variants -------------------------------------------------------------------------------------
def test_idless_upstream_ignores_return_token_ids_everywhere(idless_upstream):
    body = {
        "model": "claw-demo",
        "messages": MESSAGES,
        "logprobs": True,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    # when asked for ids, non-streamed and streamed
    r = httpx.post(f"{idless_upstream}/chat/completions", json=body).json()
    stream = httpx.post(f"{idless_upstream}/chat/completions", json={**body, "stream": True}).text
    comp = httpx.post(f"{idless_upstream}/completions", json={"prompt": "x", "return_token_ids": True}).json()
    # then no id field appears anywhere, and logprob tokens are text
    assert "prompt_token_ids" not in r and "token_ids" not in r["choices"][0]
    assert "token_ids" not in stream
    assert "token_ids" not in comp["choices"][0]
    assert not any(e["token"].startswith("token_id:") for e in r["choices"][0]["logprobs"]["content"])
    # but the reply is the same as the id-enabled server's would be (same seed)
    assert r["choices"][0]["message"]["content"]


def test_slow_upstream_adds_latency(slow_upstream):
    t0 = time.perf_counter()
    client(slow_upstream).chat.completions.create(model="claw-demo", messages=MESSAGES)
    assert time.perf_counter() - t0 >= 0.3
