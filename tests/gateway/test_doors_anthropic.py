"""The Anthropic Messages door with the official `anthropic` SDK, unmodified, against a live
server and the demo upstream: translation both ways, exact upstream ids recorded, a
multi-turn tool-use agent without drift, streaming, count_tokens, faults and bad input in
Anthropic's error shape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import httpx
import openai
import pytest

from claw_site.demo.toy_tokenizer import ToyTokenizer
from tests.gateway.proxy_support import events_of, steps_of, upstream_ids
from tests.live import LiveServer, live_server, refused_port

pytestmark = pytest.mark.live

TOK = ToyTokenizer()
MODEL = "claw-demo"
TOOLS = [
    {
        "name": "lookup",
        "description": "Look it up",
        "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": TOOLS[0]["input_schema"], "description": "Look it up"},
    }
]


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    def client(self, trajectory: str | None = None, **kw) -> anthropic.Anthropic:
        headers = {"X-Claw-Trajectory": trajectory} if trajectory else None
        return anthropic.Anthropic(
            base_url=self.server.url,
            api_key=self.key,
            max_retries=0,
            timeout=30,
            default_headers=headers,
            **kw,
        )


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    with live_server(tmp_path_factory.mktemp("gw"), {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


def _tool_agent(client: anthropic.Anthropic, *, stream: bool) -> list[anthropic.types.Message]:
    """A two-turn tool-use agent: ask, run the tool it calls, send the result back."""
    messages: list[dict] = [{"role": "user", "content": "Use the tool."}]
    replies = []
    for _ in range(2):
        kwargs = {
            "model": MODEL,
            "max_tokens": 48,
            "system": "You are terse.",
            "messages": messages,
            "tools": TOOLS,
        }
        if stream:
            with client.messages.stream(**kwargs) as s:
                reply = s.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        replies.append(reply)
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        if reply.stop_reason != "tool_use":
            break
        call = next(b for b in reply.content if b.type == "tool_use")
        messages.append(
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "42"}]}
        )
    return replies


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_use_agent_is_recorded_with_the_exact_ids_and_no_drift(gw, stream):
    # given: an unmodified Anthropic SDK agent with one tool, in a named trajectory
    traj = f"anthropic-tools-{stream}"

    # when: it runs two turns (the model calls the tool, then answers)
    first, second = _tool_agent(gw.client(traj), stream=stream)

    # then: it saw Anthropic messages: a tool_use, then text that ended the turn
    assert first.id.startswith("msg_") and first.type == "message" and first.role == "assistant"
    assert first.stop_reason == "tool_use"
    [call] = first.content
    assert call.type == "tool_use" and call.name == "lookup" and call.input == {"x": 1}
    assert second.stop_reason in ("end_turn", "max_tokens") and second.content[0].type == "text"
    # and: each step holds exactly what the upstream returned for the translated call
    s0, s1 = steps_of(gw.server, gw.key, traj)
    chat0 = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Use the tool."}]
    direct0 = upstream_ids(
        gw.upstream, {"model": MODEL, "messages": chat0, "tools": CHAT_TOOLS, "max_tokens": 48}
    )
    assert s0["messages"] == chat0
    assert s0["prompt_ids"] == direct0["prompt_token_ids"] == TOK.apply_chat_template(chat0, CHAT_TOOLS)
    assert s0["response_ids"] == direct0["choices"][0]["token_ids"]
    assert s0["metadata"]["tool_calls"] == direct0["choices"][0]["message"]["tool_calls"]
    assert s0["metadata"]["protocol"] == "anthropic-messages" and s0["metadata"]["response_id"] == first.id
    assert s0["token_source"] == "upstream" and s0["finish_reason"] == "tool_calls"
    assert first.usage.input_tokens == len(s0["prompt_ids"]) and first.usage.output_tokens == len(
        s0["response_ids"]
    )
    direct1 = upstream_ids(
        gw.upstream, {"model": MODEL, "messages": s1["messages"], "tools": CHAT_TOOLS, "max_tokens": 48}
    )
    assert s1["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": direct0["choices"][0]["message"]["tool_calls"]},
        {"role": "tool", "tool_call_id": call.id, "content": "42"},
    ]
    assert s1["response_ids"] == direct1["choices"][0]["token_ids"]
    assert s1["response_text"] == second.content[0].text
    # and: the second prompt extends the first prompt + response: no drift
    assert s1["drift"] is False
    assert (
        s1["prompt_ids"][: len(s0["prompt_ids"]) + len(s0["response_ids"])]
        == s0["prompt_ids"] + s0["response_ids"]
    )


def test_the_stream_is_anthropics_event_sequence(gw):
    # given: a raw SSE reader (to see the event names and their order)
    body = {
        "model": MODEL,
        "max_tokens": 40,
        "stream": True,
        "messages": [{"role": "user", "content": "Stream."}],
    }
    headers = {"x-api-key": gw.key, "anthropic-version": "2023-06-01", "X-Claw-Trajectory": "anthropic-sse"}

    # when
    names, step_seen_at_stop = [], None
    with httpx.stream("POST", f"{gw.server.url}/v1/messages", json=body, headers=headers, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
                if line == "event: message_stop":
                    step_seen_at_stop = len(steps_of(gw.server, gw.key, "anthropic-sse"))

    # then: message_start, one text block with deltas, message_delta, message_stop; no [DONE]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"} and len(names) > 6
    # and: the step was committed before message_stop
    assert step_seen_at_stop == 1


def test_streamed_text_matches_the_recorded_step(gw):
    # given / when: the SDK's text stream
    with gw.client("anthropic-text-stream").messages.stream(
        model=MODEL, max_tokens=40, messages=[{"role": "user", "content": "Say something."}]
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()

    # then
    [step] = steps_of(gw.server, gw.key, "anthropic-text-stream")
    assert step["response_text"] == text == final.content[0].text
    assert final.usage.output_tokens == len(step["response_ids"])
    assert final.stop_reason == ("end_turn" if step["finish_reason"] == "stop" else "max_tokens")


def test_max_tokens_maps_to_stop_reason_max_tokens(gw):
    reply = gw.client().messages.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": "Long."}]
    )
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 3


def test_scoped_and_capability_base_urls_serve_messages(gw):
    # given: an agent that can only set its base URL
    client = anthropic.Anthropic(
        base_url=f"{gw.server.url}/t/anth-scoped/anth-group", api_key=gw.key, max_retries=0
    )

    # when
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    )

    # then
    assert raw.headers["x-claw-trajectory"] == "anth-scoped"
    [step] = steps_of(gw.server, gw.key, "anth-scoped")
    assert step["prompt_group_uid"] == "anth-group"


def test_count_tokens_uses_the_upstream_tokenizer(gw):
    # given / when
    counted = gw.client().messages.count_tokens(
        model=MODEL, system="You are terse.", messages=[{"role": "user", "content": "Count me."}], tools=TOOLS
    )

    # then: the prompt the upstream would see, with the generation prompt
    chat = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count me."}]
    assert counted.input_tokens == len(TOK.apply_chat_template(chat, CHAT_TOOLS))


def test_count_tokens_without_a_tokenizer_is_a_501_in_anthropic_shape(tmp_path):
    # given a gateway with no upstream (so no /tokenize) and no local tokenizer
    with live_server(tmp_path, {"CLAW_TOKENIZER": ""}) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key=server.make_key("ingest"), max_retries=0)
        # when the agent asks for a count
        with pytest.raises(anthropic.APIStatusError) as err:
            client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Count me."}])
    # then it is told plainly that tokens cannot be counted here, in Anthropic's error shape
    assert err.value.status_code == 501
    body = err.value.response.json()
    assert body["type"] == "error" and "cannot be counted" in body["error"]["message"]
    assert "CLAW_TOKENIZER" in body["error"]["message"]


def test_auth_accepts_x_api_key_and_bearer_and_rejects_in_anthropic_shape(gw):
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    url = f"{gw.server.url}/v1/messages"
    assert (
        httpx.post(url, json=body, headers={"Authorization": f"Bearer {gw.key}"}, timeout=30).status_code
        == 200
    )
    with pytest.raises(anthropic.AuthenticationError) as exc:
        anthropic.Anthropic(base_url=gw.server.url, api_key="claw_nope_nope", max_retries=0).messages.create(
            **body
        )
    assert exc.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": exc.value.body["error"]["message"]},
    }
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic.Anthropic(
            base_url=gw.server.url, api_key=gw.server.make_key("read"), max_retries=0
        ).messages.create(**body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 8, "messages": []}, "messages"),
        (
            {"model": MODEL, "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]},
            "messages.0.role",
        ),
        (
            {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "tools": [{}]},
            "tools.0.name",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_written(gw, body, field):
    # given / when
    r = httpx.post(
        f"{gw.server.url}/v1/messages",
        json=body,
        headers={"x-api-key": gw.key, "X-Claw-Trajectory": "anth-bad"},
        timeout=30,
    )

    # then
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(field + ":")
    assert steps_of(gw.server, gw.key, "anth-bad") == []


def test_malformed_json_is_an_anthropic_400(gw):
    r = httpx.post(
        f"{gw.server.url}/v1/messages", content=b"{nope", headers={"x-api-key": gw.key}, timeout=30
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_upstream_500_is_an_api_error_and_no_step(gw):
    # given / when: the upstream fails the call
    client = gw.client("anth-500")
    with pytest.raises(anthropic.InternalServerError) as exc:
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "fail"}],
            extra_headers={"x-demo-fail": "500"},
        )

    # then: Anthropic's shape, an Event, no step
    assert exc.value.status_code == 500 and exc.value.body["error"]["type"] == "api_error"
    assert steps_of(gw.server, gw.key, "anth-500") == []
    assert events_of(gw.server, gw.key, "upstream_error")


def test_an_upstream_503_is_overloaded(gw):
    with pytest.raises(anthropic.APIStatusError) as exc:
        gw.client().messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "busy"}],
            extra_headers={"x-demo-fail": "503"},
        )
    assert exc.value.status_code == 503 and exc.value.body["error"]["type"] == "overloaded_error"


def test_a_stream_that_breaks_ends_with_an_error_event(gw):
    # given / when: the upstream drops the connection after its first chunk
    with pytest.raises(anthropic.APIStatusError) as exc:
        with gw.client("anth-drop").messages.stream(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "drop"}],
            extra_headers={"x-demo-drop": "1"},
        ) as s:
            s.get_final_message()

    # then: an Anthropic error event, no step
    assert exc.value.body["type"] == "error" and exc.value.body["error"]["type"] == "api_error"
    assert steps_of(gw.server, gw.key, "anth-drop") == []


def test_a_down_upstream_is_a_502_api_error(tmp_path):
    with (
        refused_port() as port,
        live_server(tmp_path, {"CLAW_UPSTREAM_URL": f"http://127.0.0.1:{port}/v1"}) as server,
    ):
        client = anthropic.Anthropic(base_url=server.url, api_key=server.make_key("ingest"), max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as exc:
            client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 502 and exc.value.body["error"]["type"] == "api_error"


def test_a_slow_upstream_is_a_504(tmp_path, slow_upstream):
    env = {"CLAW_UPSTREAM_URL": slow_upstream, "CLAW_UPSTREAM_TIMEOUT": "0.1"}
    with live_server(tmp_path, env) as server:
        client = anthropic.Anthropic(base_url=server.url, api_key=server.make_key("ingest"), max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as exc:
            client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 504 and exc.value.body["type"] == "error"


def _say(client: anthropic.Anthropic, system: str, messages: list[dict]) -> str:
    reply = client.messages.create(model=MODEL, max_tokens=48, system=system, messages=messages)
    return reply.content[0].text


def test_a_compaction_starts_a_branch_not_drift(gw):
    # given: an agent two turns into its task
    client = gw.client("anth-compaction")
    messages = [{"role": "user", "content": "Task."}]
    for turn in ("Go on.", "Summarise."):
        messages += [
            {"role": "assistant", "content": _say(client, "Agent.", messages)},
            {"role": "user", "content": turn},
        ]
    summary = _say(client, "Agent.", messages)

    # when: it restarts its context from its summary, and carries on from there
    restarted = [{"role": "user", "content": f"Task. Summary so far: {summary}"}]
    restarted += [
        {"role": "assistant", "content": _say(client, "Agent.", restarted)},
        {"role": "user", "content": "Next."},
    ]
    _say(client, "Agent.", restarted)

    # then: steps 0-2 are branch 0; step 3 starts branch 1 after step 2 (sharing the system
    # prompt only); step 4 continues it; nothing drifted
    steps = steps_of(gw.server, gw.key, "anth-compaction")
    assert [(s["branch"], s["drift"]) for s in steps] == [(0, False)] * 3 + [(1, False)] * 2
    assert [s["parent_step_uid"] for s in steps] == [None, *(s["uid"] for s in steps[:4])]
    assert steps[3]["metadata"]["branched_after_messages"] == 1
    # and: each branch is a prefix-consistent token sequence
    for prev, cur in ((steps[0], steps[1]), (steps[1], steps[2]), (steps[3], steps[4])):
        full = prev["prompt_ids"] + prev["response_ids"]
        assert cur["prompt_ids"][: len(full)] == full


def test_a_sub_agent_is_a_branch_and_the_main_agent_resumes_its_own(gw):
    # given: a main agent's first turn
    client = gw.client("anth-sub-agent")
    main = [{"role": "user", "content": "Plan the work."}]
    main.append({"role": "assistant", "content": _say(client, "Main agent.", main)})

    # when: it runs a sub-agent with its own context (two turns), then resumes with its result
    sub = [{"role": "user", "content": "Research one thing."}]
    sub += [
        {"role": "assistant", "content": _say(client, "Sub agent.", sub)},
        {"role": "user", "content": "Finish."},
    ]
    found = _say(client, "Sub agent.", sub)
    main.append({"role": "user", "content": f"The sub-agent found: {found}"})
    _say(client, "Main agent.", main)

    # then: the sub-agent is branch 1 (off step 0), the main agent's next call continues
    # branch 0 from step 0, its tokens checked against step 0: no drift
    s0, s1, s2, s3 = steps_of(gw.server, gw.key, "anth-sub-agent")
    assert [(s["branch"], s["parent_step_uid"], s["drift"]) for s in (s0, s1, s2, s3)] == [
        (0, None, False),
        (1, s0["uid"], False),
        (1, s1["uid"], False),
        (0, s0["uid"], False),
    ]
    full = s0["prompt_ids"] + s0["response_ids"]
    assert s3["prompt_ids"][: len(full)] == full


def test_a_capability_url_serves_both_doors_for_its_trajectory_only(gw):
    # given: a capability URL (the token alone authorises, for its own trajectory)
    minted = httpx.post(
        f"{gw.server.url}/api/v1/trajectories",
        json={"uid": "anth-cap"},
        headers={"Authorization": f"Bearer {gw.key}"},
        timeout=30,
    ).json()
    base_url = minted["base_url"]  # .../t/c/<token>/anth-cap/-/v1

    # when: an Anthropic agent and a Responses agent use it with a dummy key
    anthropic.Anthropic(
        base_url=base_url.removesuffix("/v1"), api_key="not-needed", max_retries=0
    ).messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    reply = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0).responses.create(
        model=MODEL, input="hi"
    )

    # then: both steps are in its trajectory
    steps = steps_of(gw.server, gw.key, "anth-cap")
    assert [s["metadata"]["protocol"] for s in steps] == ["anthropic-messages", "openai-responses"]
    assert steps[1]["metadata"]["response_id"] == reply.id


@pytest.fixture(scope="module")
def passthrough(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    """The gateway in passthrough mode: /v1/messages forwarded to the demo upstream's own
    Messages endpoint (no token ids), steps retokenized with a local tokenizer."""
    from tests.gateway.proxy_support import build_tokenizer

    tok_dir = build_tokenizer(tmp_path_factory.mktemp("tok"))
    env = {
        "CLAW_UPSTREAM_URL": demo_upstream,
        "CLAW_MESSAGES_UPSTREAM_MODE": "passthrough",
        "CLAW_TOKENIZER": str(tok_dir),
    }
    with live_server(tmp_path_factory.mktemp("pt"), env) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_passthrough_relays_the_upstreams_answer_and_records_retokenized_ids(passthrough, stream):
    """README: "The Messages passthrough mode cannot have them (its upstream returns neither
    ids nor logprobs): like every step stored without logprobs, its steps have
    rollout_logprobs null and the quality flag missing_logprobs." """
    # given: an agent in a named trajectory, the gateway in passthrough mode
    traj = f"anth-passthrough-{stream}"
    client = passthrough.client(traj)
    kwargs = {
        "model": MODEL,
        "max_tokens": 48,
        "system": "Be terse.",
        "messages": [{"role": "user", "content": "Hi."}],
    }

    # when
    if stream:
        with client.messages.stream(**kwargs) as s:
            reply = s.get_final_message()
    else:
        reply = client.messages.create(**kwargs)

    # then: the agent got the upstream's own answer (its id), and the step was recorded from
    # text, retokenized, marked so
    direct = httpx.post(f"{passthrough.upstream}/messages", json=kwargs, timeout=30).json()
    assert reply.content[0].text == direct["content"][0]["text"]
    assert reply.id.startswith("msg_") and reply.stop_reason == direct["stop_reason"]
    [step] = steps_of(passthrough.server, passthrough.key, traj)
    assert step["token_source"] == "retokenized"
    assert step["metadata"]["upstream_mode"] == "passthrough" and step["metadata"]["response_id"] == reply.id
    assert step["rollout_logprobs"] is None and "missing_logprobs" in step["quality_flags"]
    assert step["response_text"] == reply.content[0].text
    assert step["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi."},
    ]


def test_passthrough_still_rejects_bad_input_by_field(passthrough):
    r = httpx.post(
        f"{passthrough.server.url}/v1/messages",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": passthrough.key},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens:")


def test_passthrough_streamed_tool_use_keeps_the_models_argument_string(passthrough):
    # given / when: a streamed call in which the model calls a tool
    with passthrough.client("anth-pt-tool").messages.stream(
        model=MODEL, max_tokens=48, messages=[{"role": "user", "content": "Use it."}], tools=TOOLS
    ) as s:
        reply = s.get_final_message()

    # then: the agent got the tool_use; the step holds the call as the model wrote it
    assert reply.stop_reason == "tool_use" and reply.content[0].input == {"x": 1}
    [step] = steps_of(passthrough.server, passthrough.key, "anth-pt-tool")
    assert step["metadata"]["tool_calls"] == [
        {
            "id": reply.content[0].id,
            "type": "function",
            "function": {"name": "lookup", "arguments": '{"x": 1}'},
        }
    ]
    assert step["finish_reason"] == "tool_calls"
