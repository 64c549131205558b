"""The OpenAI Responses door with the official `openai` SDK's Responses client, unmodified,
against a live server and the demo upstream: a multi-turn tool-use agent (stateless items
and previous_response_id), streaming, store: false, faults and bad input in OpenAI's shape."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from claw_site.demo.toy_tokenizer import ToyTokenizer
from tests.gateway.proxy_support import auth, steps_of, upstream_ids
from tests.live import LiveServer, live_server, refused_port

pytestmark = pytest.mark.live

TOK = ToyTokenizer()
MODEL = "claw-demo"
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look it up",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }
]
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": TOOLS[0]["parameters"], "description": "Look it up"},
    }
]


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    def client(self, trajectory: str | None = None, **kw) -> openai.OpenAI:
        headers = {"X-Claw-Trajectory": trajectory} if trajectory else None
        return openai.OpenAI(
            base_url=f"{self.server.url}/v1",
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


def _create(client: openai.OpenAI, *, stream: bool, **kwargs):
    if not stream:
        return client.responses.create(**kwargs)
    with client.responses.stream(**kwargs) as s:
        return s.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_stateless_tool_use_agent_is_recorded_with_the_exact_ids_and_no_drift(gw, stream):
    # given: an agent that keeps its own item list (no previous_response_id)
    traj = f"responses-tools-{stream}"
    client = gw.client(traj)
    items: list = [{"role": "user", "content": "Use the tool."}]

    # when: the model calls the tool, the agent returns its output, the model answers
    first = _create(client, stream=stream, model=MODEL, instructions="Be terse.", input=items, tools=TOOLS)
    [call] = first.output
    items += [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
    ]
    second = _create(client, stream=stream, model=MODEL, instructions="Be terse.", input=items, tools=TOOLS)

    # then: Responses objects: a function_call, then a message whose text the SDK joins
    assert first.id.startswith("resp_") and first.status == "completed"
    assert call.type == "function_call" and call.name == "lookup" and call.arguments == '{"x": 1}'
    assert second.output[0].type == "message" and second.output_text
    # and: exact ids of the translated chat calls; the second extends the first: no drift
    s0, s1 = steps_of(gw.server, gw.key, traj)
    chat0 = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Use the tool."}]
    direct0 = upstream_ids(gw.upstream, {"model": MODEL, "messages": chat0, "tools": CHAT_TOOLS})
    assert s0["messages"] == chat0 and s0["prompt_ids"] == direct0["prompt_token_ids"]
    assert s0["response_ids"] == direct0["choices"][0]["token_ids"]
    assert s0["metadata"]["protocol"] == "openai-responses" and s0["metadata"]["response_id"] == first.id
    direct1 = upstream_ids(gw.upstream, {"model": MODEL, "messages": s1["messages"], "tools": CHAT_TOOLS})
    assert s1["response_ids"] == direct1["choices"][0]["token_ids"]
    assert s1["response_text"] == second.output_text
    assert s1["drift"] is False
    assert (
        s1["prompt_ids"][: len(s0["prompt_ids"]) + len(s0["response_ids"])]
        == s0["prompt_ids"] + s0["response_ids"]
    )
    assert first.usage.input_tokens == len(s0["prompt_ids"]) and first.usage.output_tokens == len(
        s0["response_ids"]
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_previous_response_id_is_resolved_from_the_pool(gw, stream):
    # given: an agent that chains responses by id only (a stateless upstream behind)
    client = gw.client()
    first = _create(
        client, stream=stream, model=MODEL, instructions="Be terse.", input="Use the tool.", tools=TOOLS
    )
    call = first.output[0]

    # when: it sends only the tool output with previous_response_id (and its instructions again)
    second = _create(
        client,
        stream=stream,
        model=MODEL,
        previous_response_id=first.id,
        instructions="Be terse.",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "42"}],
        tools=TOOLS,
    )
    third = _create(
        client,
        stream=stream,
        model=MODEL,
        previous_response_id=second.id,
        instructions="Be terse.",
        input="Thanks.",
        tools=TOOLS,
    )

    # then: all three are steps of the first call's trajectory, the conversation rebuilt
    traj = bytes.fromhex(first.id[len("resp_") + 24 :]).decode()  # a response id names its trajectory
    s0, s1, s2 = steps_of(gw.server, gw.key, traj)
    assert s1["messages"] == [
        {"role": "system", "content": "Be terse."},  # once: instructions are not carried over
        {"role": "user", "content": "Use the tool."},
        {"role": "assistant", "content": None, "tool_calls": s0["metadata"]["tool_calls"]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "42"},
    ]
    assert s2["messages"][-2:] == [
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "Thanks."},
    ]
    assert s1["metadata"]["previous_response_id"] == first.id
    assert s1["drift"] is False and s2["drift"] is False
    assert s2["metadata"]["response_id"] == third.id


def test_store_false_cannot_be_continued(gw):
    # given: a response created with store: false
    first = gw.client().responses.create(model=MODEL, input="Do not keep this.", store=False)

    # when / then: continuing it is a 404 naming previous_response_id
    with pytest.raises(openai.NotFoundError) as exc:
        gw.client().responses.create(model=MODEL, input="More.", previous_response_id=first.id)
    assert exc.value.body["param"] == "previous_response_id" and "store: false" in exc.value.body["message"]
    assert first.store is False


def test_an_unknown_previous_response_is_a_404(gw):
    with pytest.raises(openai.NotFoundError):
        gw.client().responses.create(model=MODEL, input="x", previous_response_id="resp_nope")


def test_a_response_of_another_trajectory_cannot_be_continued_from_a_named_one(gw):
    first = gw.client("resp-owner").responses.create(model=MODEL, input="mine")
    with pytest.raises(openai.NotFoundError):
        gw.client("resp-other").responses.create(model=MODEL, input="x", previous_response_id=first.id)


def test_the_stream_is_the_responses_event_sequence(gw):
    # given: a raw SSE reader
    body = {"model": MODEL, "input": "Stream.", "stream": True}
    headers = {**auth(gw.key), "X-Claw-Trajectory": "responses-sse"}

    # when
    events, stored_at_completed = [], None
    with httpx.stream("POST", f"{gw.server.url}/v1/responses", json=body, headers=headers, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                events.append(line[7:])
                if line == "event: response.completed":
                    stored_at_completed = len(steps_of(gw.server, gw.key, "responses-sse"))

    # then
    assert events[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert events[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert stored_at_completed == 1


def test_streamed_function_calls_use_the_arguments_events(gw):
    # given / when
    with gw.client().responses.stream(model=MODEL, input="Use the tool.", tools=TOOLS) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()

    # then
    assert (
        "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    )
    assert final.output[0].type == "function_call" and final.output[0].arguments == '{"x": 1}'


def test_max_output_tokens_makes_an_incomplete_response(gw):
    r = gw.client().responses.create(model=MODEL, input="Long.", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": "hi"}, "model"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": 5}, "input"),
        ({"model": MODEL, "input": [{"type": "mystery"}]}, "input[0].type"),
        ({"model": MODEL, "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"model": MODEL, "input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"model": MODEL, "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_nothing_is_written(gw, body, field):
    r = httpx.post(
        f"{gw.server.url}/v1/responses",
        json=body,
        headers={**auth(gw.key), "X-Claw-Trajectory": "resp-bad"},
        timeout=30,
    )
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == field
    assert steps_of(gw.server, gw.key, "resp-bad") == []


def test_an_upstream_500_is_an_openai_error_and_no_step(gw):
    with pytest.raises(openai.InternalServerError) as exc:
        gw.client("resp-500").responses.create(
            model=MODEL, input="fail", extra_headers={"x-demo-fail": "500"}
        )
    assert exc.value.status_code == 500 and exc.value.body["type"] == "api_error"
    assert steps_of(gw.server, gw.key, "resp-500") == []


def test_a_stream_that_breaks_raises_in_the_sdk(gw):
    with pytest.raises(openai.APIError):
        with gw.client("resp-drop").responses.stream(
            model=MODEL, input="drop", extra_headers={"x-demo-drop": "1"}
        ) as s:
            s.get_final_response()
    assert steps_of(gw.server, gw.key, "resp-drop") == []


def test_a_down_upstream_is_a_502(tmp_path):
    with (
        refused_port() as port,
        live_server(tmp_path, {"CLAW_UPSTREAM_URL": f"http://127.0.0.1:{port}/v1"}) as server,
    ):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.make_key("ingest"), max_retries=0)
        with pytest.raises(openai.APIStatusError) as exc:
            client.responses.create(model=MODEL, input="hi")
    assert exc.value.status_code == 502 and exc.value.body["code"] == "connect_error"


def test_a_key_is_required(gw):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{gw.server.url}/v1", api_key="claw_nope_nope", max_retries=0
        ).responses.create(model=MODEL, input="hi")


def test_a_compaction_through_responses_is_a_branch(gw):
    # given: a chained conversation
    client = gw.client("resp-compaction")
    first = client.responses.create(model=MODEL, instructions="Agent.", input="Task.")
    second = client.responses.create(
        model=MODEL, instructions="Agent.", input="Go on.", previous_response_id=first.id
    )

    # when: the agent starts over from a summary (no previous_response_id)
    client.responses.create(model=MODEL, instructions="Agent.", input=f"Task. So far: {second.output_text}")

    # then
    s0, s1, s2 = steps_of(gw.server, gw.key, "resp-compaction")
    assert [(s["branch"], s["drift"]) for s in (s0, s1, s2)] == [(0, False), (0, False), (1, False)]
    assert s2["parent_step_uid"] == s1["uid"]


def test_a_slow_upstream_is_a_504(tmp_path, slow_upstream):
    env = {"CLAW_UPSTREAM_URL": slow_upstream, "CLAW_UPSTREAM_TIMEOUT": "0.1"}
    with live_server(tmp_path, env) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.make_key("ingest"), max_retries=0)
        with pytest.raises(openai.APIStatusError) as exc:
            client.responses.create(model=MODEL, input="hi")
    assert exc.value.status_code == 504 and exc.value.body["code"] == "timeout"
