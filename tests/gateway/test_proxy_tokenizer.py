"""An upstream that returns no token ids (a plain OpenAI server): the gateway re-encodes the
call with the local tokenizer at CLAW_TOKENIZER (token_source "retokenized"); without one,
the call is kept as an ``untokenized_call`` Event and no step is stored."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from tests.gateway.proxy_support import build_tokenizer, events_of, steps_of, trajectory_of
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"


@dataclass
class Gateway:
    server: LiveServer
    key: str

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=30, **kw
        )


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def hf(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)


@pytest.fixture(scope="module")
def retok(tmp_path_factory, idless_upstream, tokenizer_dir) -> Iterator[Gateway]:
    env = {"CLAW_UPSTREAM_URL": idless_upstream, "CLAW_TOKENIZER": str(tokenizer_dir)}
    with live_server(tmp_path_factory.mktemp("retok"), env) as server:
        yield Gateway(server, server.make_key("ingest", "read"))


@pytest.fixture(scope="module")
def bare(tmp_path_factory, idless_upstream) -> Iterator[Gateway]:
    with live_server(tmp_path_factory.mktemp("bare"), {"CLAW_UPSTREAM_URL": idless_upstream}) as server:
        yield Gateway(server, server.make_key("ingest", "read"))


def _template(hf, messages, **kw) -> list[int]:
    return list(hf.apply_chat_template(messages, tokenize=True, return_dict=False, **kw))


def test_without_upstream_ids_the_local_tokenizer_encodes_the_call(retok, hf):
    # given: a plain OpenAI upstream and a local tokenizer
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo there"}]

    # when
    raw = retok.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    reply = raw.parse().choices[0].message

    # then: the step is the chat template's encoding, marked retokenized
    [step] = steps_of(retok.server, retok.key, raw.headers["x-claw-trajectory"])
    assert step["token_source"] == "retokenized"
    prompt = _template(hf, messages, add_generation_prompt=True)
    assert step["prompt_ids"] == prompt
    full = _template(hf, [*messages, {"role": "assistant", "content": reply.content}])
    assert step["response_ids"] == full[len(prompt) :]
    assert hf.decode(step["response_ids"]).startswith(reply.content)
    assert step["response_text"] == reply.content


def test_streamed_calls_and_tools_are_retokenized_too(retok, hf):
    # given: a streamed call with tools
    tools = [
        {
            "type": "function",
            "function": {"name": "search", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    messages = [{"role": "user", "content": "find it"}]

    # when
    stream = retok.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, tools=tools, stream=True
    )
    traj = stream.headers["x-claw-trajectory"]
    chunks = list(stream.parse())

    # then: the prompt includes the tools as the template renders them, and the tool call is kept
    [step] = steps_of(retok.server, retok.key, traj)
    assert step["prompt_ids"] == _template(hf, messages, tools=tools, add_generation_prompt=True)
    assert step["metadata"]["tool_calls"][0]["function"]["name"] == "search"
    assert any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    assert step["token_source"] == "retokenized" and len(step["response_ids"]) > 0


def test_without_ids_or_tokenizer_the_call_is_an_event_not_a_step(bare):
    # given: a plain OpenAI upstream and no tokenizer
    messages = [{"role": "user", "content": "untrainable"}]

    # when: the agent still gets its answer
    raw = bare.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages)
    content = raw.parse().choices[0].message.content
    traj = raw.headers["x-claw-trajectory"]

    # then: no step, but an Event holding the call's text
    assert content
    assert steps_of(bare.server, bare.key, traj) == []
    assert trajectory_of(bare.server, bare.key, traj).status_code == 404
    [event] = events_of(bare.server, bare.key, "untokenized_call", traj)
    assert event["payload"]["messages"] == messages
    assert event["payload"]["choices"][0]["message"]["content"] == content
