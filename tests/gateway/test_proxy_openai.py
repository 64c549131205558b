"""The OpenAI-compatible gateway with the official `openai` client (sync, async, streaming)
against a live server process and the demo upstream: exact upstream ids are recorded,
vLLM fields are stripped, trajectories, drift, n > 1, tools, completions, models, auth."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from claw_kit.web import server_timing
from claw_site.demo.toy_tokenizer import BOS, ToyTokenizer
from tests.gateway.proxy_support import auth, steps_of, upstream_ids
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

TOK = ToyTokenizer()
MODEL = "claw-demo"


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=30, **kw
        )

    def aclient(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=30, **kw
        )


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    """A live server (the project's ASGI app) forwarding to the demo upstream."""
    with live_server(tmp_path_factory.mktemp("gw"), {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


def test_sync_chat_records_the_upstream_ids_and_strips_vendor_fields(gw):
    # given: an unmodified OpenAI SDK agent pointed at the gateway
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]

    # when: it asks for a completion
    raw = gw.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=24)

    # then: it gets a normal answer without vLLM's id fields, and its trajectory uid
    body = raw.http_response.json()
    assert "prompt_token_ids" not in body and "token_ids" not in body["choices"][0]
    completion = raw.parse()
    traj = raw.headers["x-claw-trajectory"]
    assert raw.headers["x-claw-steps"] == f"{traj}:0"
    # and: the stored step holds exactly the ids the upstream produced
    expected = upstream_ids(gw.upstream, {"model": MODEL, "messages": messages, "max_tokens": 24})
    [step] = steps_of(gw.server, gw.key, traj)
    assert step["prompt_ids"] == expected["prompt_token_ids"] == TOK.apply_chat_template(messages)
    assert step["response_ids"] == expected["choices"][0]["token_ids"]
    assert step["token_source"] == "upstream"
    assert step["response_text"] == completion.choices[0].message.content
    assert step["finish_reason"] == completion.choices[0].finish_reason
    assert step["messages"] == messages
    assert step["metadata"]["endpoint"] == "chat.completions"
    assert step["metadata"]["params"]["max_tokens"] == 24
    assert step["drift"] is False and step["step_index"] == 0


def test_the_answer_says_where_its_time_went(gw):
    # given an agent's call, and one the gateway refuses (a bad key)
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "how long?"}], max_tokens=8
    )
    refused = httpx.post(
        f"{gw.server.url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
        headers=auth("claw_not_a_key"),
        timeout=30,
    )
    # then the answer's Server-Timing has the upstream's time, the record's and the total
    timing = server_timing.parse(raw.headers["server-timing"])
    assert list(timing) == ["upstream", "record", "total"], timing
    assert timing["upstream"] > 0 and timing["record"] > 0
    assert timing["total"] >= timing["upstream"] + timing["record"], timing
    # and its upstream time is the interval stored as the step's latency (rounded to 0.1 ms)
    [step] = steps_of(gw.server, gw.key, raw.headers["x-claw-trajectory"])
    assert abs(step["metadata"]["latency_ms"] - timing["upstream"]) <= 0.0505, (step["metadata"], timing)
    # and the refusal, which stored nothing and went nowhere, has only the total
    assert refused.status_code == 401
    assert list(server_timing.parse(refused.headers["server-timing"])) == ["total"]


def test_the_header_is_read_as_its_grammar_allows():
    # what the gateway writes reads back exactly
    written = ", ".join([server_timing.metric("upstream", 0.0004), server_timing.metric("record", 0.0012)])
    assert server_timing.parse(written) == {"upstream": 0.4, "record": 1.2}
    # parameters in any order, spaces around ";", and a metric without a duration left out
    header = 'cache;desc="hit" ; dur=2.5, miss, db; dur=0.75;desc="x"'
    assert server_timing.parse(header) == {"cache": 2.5, "db": 0.75}
    # a quoted value holding "," or ";" stays whole, a quoted dur counts, the first dur wins,
    # and a dur that is not a number leaves its metric out
    header = 'cdn;desc="edge, hit; warm";dur=1.5, app;dur="3";dur=9, bad;dur=soon, total;dur=4.25'
    assert server_timing.parse(header) == {"cdn": 1.5, "app": 3.0, "total": 4.25}


def test_a_replay_has_no_upstream_time_and_a_stream_no_timing(gw):
    # given a call with an Idempotency-Key, sent twice
    body = {"model": MODEL, "messages": [{"role": "user", "content": "once"}], "max_tokens": 8}
    headers = {**auth(gw.key), "Idempotency-Key": "timing-replay-1"}
    first, replay = (
        httpx.post(f"{gw.server.url}/v1/chat/completions", json=body, headers=headers, timeout=30)
        for _ in range(2)
    )
    # then the replay is the first answer, without the first call's upstream or record time
    assert first.status_code == replay.status_code == 200
    assert replay.headers["idempotent-replayed"] == "true" and replay.content == first.content
    assert list(server_timing.parse(first.headers["server-timing"])) == ["upstream", "record", "total"]
    assert list(server_timing.parse(replay.headers["server-timing"])) == ["total"]
    # and a streamed answer, whose headers leave before any of it is known, has none
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "stream"}], max_tokens=8, stream=True
    )
    assert "server-timing" not in raw.headers
    chunks = list(raw.parse())
    assert chunks and raw.headers["x-claw-trajectory"]


def test_agent_that_asks_for_ids_gets_them_and_logprobs_are_recorded(gw):
    # given: an agent that asks for token ids and logprobs itself
    messages = [{"role": "user", "content": "ids please"}]

    # when
    raw = gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, logprobs=True, extra_body={"return_token_ids": True}
    )

    # then: the vendor fields reach it unchanged, and the step has the logprobs
    body = raw.http_response.json()
    [step] = steps_of(gw.server, gw.key, raw.headers["x-claw-trajectory"])
    assert body["prompt_token_ids"] == step["prompt_ids"]
    assert body["choices"][0]["token_ids"] == step["response_ids"]
    assert step["rollout_logprobs"] == [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]


async def test_async_streaming_is_relayed_chunk_by_chunk_and_recorded(gw):
    # given: an async agent that streams and wants usage
    messages = [{"role": "user", "content": "Stream a sentence."}]
    client = gw.aclient()

    # when
    stream = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, stream=True, stream_options={"include_usage": True}, max_tokens=40
    )
    traj = stream.headers["x-claw-trajectory"]
    parsed = stream.parse()
    if asyncio.iscoroutine(parsed):  # older SDKs: parse() is a coroutine on the async client
        parsed = await parsed
    chunks = [c async for c in parsed]
    await client.close()

    # then: many chunks (not one buffered blob), the last one carries usage, no vendor fields
    assert len(chunks) > 4
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert all(
        "token_ids" not in (c.model_extra or {}) and "prompt_token_ids" not in (c.model_extra or {})
        for c in chunks
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # and: the step is the accumulated stream, with the upstream's exact ids
    expected = upstream_ids(gw.upstream, {"model": MODEL, "messages": messages, "max_tokens": 40})
    [step] = steps_of(gw.server, gw.key, traj)
    assert step["prompt_ids"] == expected["prompt_token_ids"]
    assert step["response_ids"] == expected["choices"][0]["token_ids"]
    assert step["response_text"] == text
    assert step["metadata"]["usage"] == chunks[-1].usage.model_dump(exclude_none=True)


def test_stream_without_include_usage_sends_no_usage_chunk(gw):
    # given / when: a stream without stream_options
    chunks = list(
        gw.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "no usage"}], stream=True
        )
    )

    # then
    assert chunks and all(c.usage is None for c in chunks)


def test_the_step_is_committed_before_the_final_event(gw):
    # given: a raw SSE reader
    traj = "committed-before-done"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "durable"}], "stream": True}
    headers = {**auth(gw.key), "X-Claw-Trajectory": traj}

    # when: it reads up to "data: [DONE]" and stops there
    with httpx.stream(
        "POST", f"{gw.server.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if line == "data: [DONE]":
                    # then: at that moment the step is already stored
                    assert len(steps_of(gw.server, gw.key, traj)) == 1
                    break
    assert events[-1] == "[DONE]" and len(events) > 3


def test_a_multi_turn_agent_has_no_drift_and_counts_steps(gw):
    # given: an agent that keeps its history and names its trajectory
    client = gw.client(default_headers={"X-Claw-Trajectory": "multi-turn-1"})
    messages = [{"role": "user", "content": "Turn zero."}]

    # when: three turns
    for turn in range(3):
        reply = client.chat.completions.create(model=MODEL, messages=messages).choices[0].message
        messages += [
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": f"Turn {turn + 1}."},
        ]

    # then: steps 0..2, each prompt extends the previous prompt + response, no drift
    steps = steps_of(gw.server, gw.key, "multi-turn-1")
    assert [s["step_index"] for s in steps] == [0, 1, 2]
    assert not any(s["drift"] for s in steps)
    for prev, cur in zip(steps, steps[1:], strict=False):
        full = prev["prompt_ids"] + prev["response_ids"]
        assert cur["prompt_ids"][: len(full)] == full


def test_an_agent_that_edits_its_history_starts_a_branch_stored_as_sent(gw):
    # given: a first turn
    client = gw.client(default_headers={"X-Claw-Trajectory": "edits-history"})
    first = [{"role": "user", "content": "Original question."}]
    reply = client.chat.completions.create(model=MODEL, messages=first).choices[0].message.content

    # when: the second turn rewrites the first user message
    edited = [
        {"role": "user", "content": "Original QUESTION."},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Next."},
    ]
    client.chat.completions.create(model=MODEL, messages=edited)

    # then: its messages do not extend the first call's: a new branch off step 0, not drift
    s0, s1 = steps_of(gw.server, gw.key, "edits-history")
    assert (s1["branch"], s1["parent_step_uid"], s1["drift"]) == (1, s0["uid"], False)
    assert s1["metadata"]["branched_after_messages"] == 0
    assert s1["prompt_ids"] == TOK.apply_chat_template(edited)  # stored as sent, not repaired
    assert (s0["branch"], s0["parent_step_uid"], s0["drift"]) == (0, None, False)


def test_messages_that_extend_with_tokens_that_do_not_are_drift(gw):
    # given: a tool call whose arguments the model wrote as '{"x": 1}'
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    client = gw.client(default_headers={"X-Claw-Trajectory": "reformatted-args"})
    messages = [{"role": "user", "content": "Use the tool."}]
    call = (
        client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        .choices[0]
        .message.tool_calls[0]
    )

    # when: the agent echoes the call back with the arguments re-serialised ('{"x":1}')
    echoed = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": '{"x":1}'},
    }
    follow = [*messages, {"role": "assistant", "content": None, "tool_calls": [echoed]}]
    client.chat.completions.create(
        model=MODEL, messages=[*follow, {"role": "tool", "tool_call_id": call.id, "content": "1"}]
    )

    # then: the same conversation (same branch, continuing step 0), but the ids drifted
    s0, s1 = steps_of(gw.server, gw.key, "reformatted-args")
    assert (s1["branch"], s1["parent_step_uid"]) == (0, s0["uid"])
    full = s0["prompt_ids"] + s0["response_ids"]
    mismatch = next(i for i, (a, b) in enumerate(zip(full, s1["prompt_ids"], strict=False)) if a != b)
    assert (s1["drift"], s1["drift_offset"]) == (True, mismatch)


def test_n_choices_record_one_step_each_and_the_next_turn_continues_one(gw):
    # given: a call with n=3
    client = gw.client(default_headers={"X-Claw-Trajectory": "n-three"})
    messages = [{"role": "user", "content": "Three ways."}]
    completion = client.chat.completions.create(model=MODEL, messages=messages, n=3)

    # when: the agent continues the second choice
    chosen = completion.choices[1].message.content
    client.chat.completions.create(
        model=MODEL,
        messages=[*messages, {"role": "assistant", "content": chosen}, {"role": "user", "content": "More."}],
    )

    # then: steps 0..2 are the choices (same prompt, their own ids), step 3 extends choice 1
    expected = upstream_ids(gw.upstream, {"model": MODEL, "messages": messages, "n": 3})
    steps = steps_of(gw.server, gw.key, "n-three")
    assert [s["step_index"] for s in steps] == [0, 1, 2, 3]
    for i in range(3):
        assert steps[i]["metadata"]["choice_index"] == i and steps[i]["metadata"]["n"] == 3
        assert steps[i]["prompt_ids"] == expected["prompt_token_ids"]
        assert steps[i]["response_ids"] == expected["choices"][i]["token_ids"]
        assert steps[i]["response_text"] == completion.choices[i].message.content
    assert steps[3]["drift"] is False
    assert steps[3]["prompt_ids"][: len(steps[1]["prompt_ids"]) + len(steps[1]["response_ids"])] == (
        steps[1]["prompt_ids"] + steps[1]["response_ids"]
    )


def test_tools_and_tool_calls_pass_through_and_are_recorded(gw):
    # given: a tool-using agent
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look it up",
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
            },
        }
    ]
    client = gw.client(default_headers={"X-Claw-Trajectory": "tools-1"})
    messages = [{"role": "user", "content": "Use the tool."}]

    # when: the model calls the tool and the agent sends the result back
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, tools=tools)
    direct = upstream_ids(gw.upstream, {"model": MODEL, "messages": messages, "tools": tools})
    call = raw.parse().choices[0].message.tool_calls[0]
    follow = [
        *messages,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    client.chat.completions.create(model=MODEL, messages=follow, tools=tools)

    # then: the agent saw the upstream's tool_calls unchanged
    assert (
        raw.http_response.json()["choices"][0]["message"]["tool_calls"]
        == direct["choices"][0]["message"]["tool_calls"]
    )
    # and: the step records the tools, the call and the exact ids; the follow-up does not drift
    s0, s1 = steps_of(gw.server, gw.key, "tools-1")
    assert s0["metadata"]["tools"] == tools
    assert s0["metadata"]["tool_calls"] == direct["choices"][0]["message"]["tool_calls"]
    assert s0["finish_reason"] == "tool_calls"
    assert s0["response_ids"] == direct["choices"][0]["token_ids"]
    assert s1["drift"] is False and s1["messages"][-1] == {
        "role": "tool",
        "tool_call_id": call.id,
        "content": "42",
    }


def test_a_tool_call_records_the_same_response_text_whole_and_streamed(gw):
    # given: the same tool-calling request, answered whole and streamed
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Use the tool."}]
    for stream, traj in ((False, "tool-whole"), (True, "tool-streamed")):
        client = gw.client(default_headers={"X-Claw-Trajectory": traj})
        got = client.chat.completions.create(model=MODEL, messages=messages, tools=tools, stream=stream)
        if stream:
            for _ in got:
                pass
    # then: both steps hold the call, and no text (null, as the whole answer's content is)
    whole, streamed = (steps_of(gw.server, gw.key, t)[0] for t in ("tool-whole", "tool-streamed"))
    assert whole["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    assert whole["response_text"] is None and streamed["response_text"] is None
    assert whole["metadata"]["tool_calls"][0]["function"] == streamed["metadata"]["tool_calls"][0]["function"]


def test_text_completions_are_recorded(gw):
    # given / when: the legacy completions endpoint
    raw = gw.client().completions.with_raw_response.create(
        model=MODEL, prompt="Once upon a time", max_tokens=20
    )

    # then
    expected = upstream_ids(
        gw.upstream, {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 20}, endpoint="completions"
    )
    [step] = steps_of(gw.server, gw.key, raw.headers["x-claw-trajectory"])
    assert (
        step["prompt_ids"]
        == [BOS, *TOK.encode("Once upon a time")]
        == expected["choices"][0]["prompt_token_ids"]
    )
    assert step["response_ids"] == expected["choices"][0]["token_ids"]
    assert step["response_text"] == raw.parse().choices[0].text
    assert step["metadata"]["prompt"] == "Once upon a time" and step["messages"] is None
    assert "token_ids" not in raw.http_response.json()["choices"][0]


def test_scoped_base_url_and_headers_name_trajectory_group_and_policy(gw):
    # given: an agent that can only set its base URL, plus a policy version header
    client = openai.OpenAI(
        base_url=f"{gw.server.url}/t/scoped-traj/scoped-group/v1",
        api_key=gw.key,
        max_retries=0,
        default_headers={"X-Claw-Policy-Version": "7"},
    )

    # when
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )

    # then
    assert raw.headers["x-claw-trajectory"] == "scoped-traj"
    [step] = steps_of(gw.server, gw.key, "scoped-traj")
    assert step["prompt_group_uid"] == "scoped-group" and step["policy_version"] == 7


def test_headers_name_the_group(gw):
    # given / when: trajectory and group by headers
    gw.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Claw-Trajectory": "hdr-traj", "X-Claw-Prompt-Group": "hdr-group"},
    )

    # then
    assert steps_of(gw.server, gw.key, "hdr-traj")[0]["prompt_group_uid"] == "hdr-group"


def test_models_are_listed_from_the_upstream(gw):
    assert "claw-demo" in [m.id for m in gw.client().models.list()]


async def test_concurrent_calls_of_one_trajectory_get_distinct_step_indexes(gw):
    # given: 24 calls of one trajectory in flight at once
    client = gw.aclient(default_headers={"X-Claw-Trajectory": "concurrent-one"})

    # when
    await asyncio.gather(
        *(
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"call {i}"}])
            for i in range(24)
        )
    )
    await client.close()

    # then: indexes 0..23, each once
    assert [s["step_index"] for s in steps_of(gw.server, gw.key, "concurrent-one")] == list(range(24))


def test_a_key_is_required_and_needs_the_ingest_scope(gw):
    # given: no key, and a read-only key
    reader = gw.server.make_key("read")

    # when / then
    with pytest.raises(openai.AuthenticationError) as missing:
        openai.OpenAI(base_url=f"{gw.server.url}/v1", api_key="claw_nope_nope", max_retries=0).models.list()
    assert missing.value.body["type"] == "authentication_error"
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=f"{gw.server.url}/v1", api_key=reader, max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )


def test_a_bad_request_body_is_answered_in_openai_shape(gw):
    # given / when: a body that is not JSON
    r = httpx.post(f"{gw.server.url}/v1/chat/completions", content=b"{not json", headers=auth(gw.key))

    # then
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert r.headers["x-claw-trajectory"]


def test_other_endpoints_are_an_openai_shaped_404(gw):
    with pytest.raises(openai.NotFoundError) as exc:
        gw.client().embeddings.create(model=MODEL, input="x")
    assert exc.value.body["code"] == "unknown_endpoint"
