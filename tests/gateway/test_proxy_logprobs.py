"""Logprobs by default from every proxy door (gateway/proxy/fields.py), with the official
`openai` and `anthropic` SDKs against live servers and the demo upstream: every call asks the
upstream for the sampled tokens' logprobs, the step stores them as rollout_logprobs (one per
response id, the upstream's values), and the agent gets them only when it asked, then exactly
as the upstream sent them. CLAW_UPSTREAM_LOGPROBS=0 asks only for the agent; an upstream
that refuses the fields is asked again without them and remembered. What the upstream was
sent is read back from the upstream harness (``x-test-record``).

README: "Logprobs come by default from every gateway door: each chat, completions, Messages,
Responses and Claw-R1 /generate call asks the upstream for the sampled tokens' logprobs
(CLAW_UPSTREAM_LOGPROBS, on by default), the step stores them as rollout_logprobs, and the
agent gets them only if it asked for them." (one test per door, the gw fixture with the
setting unset)"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from gateway.proxy import fields
from gateway.proxy.recording import CHAT, COMPLETIONS
from tests.gateway.proxy_support import auth, steps_of, upstream_ids, upstream_received
from tests.live import LiveServer, live_server

MODEL = "claw-demo"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    def openai(self, name: str, trajectory: str, **headers: str) -> openai.OpenAI:
        """A client whose calls the upstream records under ``name``, in ``trajectory``."""
        return openai.OpenAI(
            base_url=f"{self.server.url}/v1",
            api_key=self.key,
            max_retries=0,
            timeout=30,
            default_headers={"x-test-record": name, "X-Claw-Trajectory": trajectory, **headers},
        )

    def anthropic(self, name: str, trajectory: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.server.url,
            api_key=self.key,
            max_retries=0,
            timeout=30,
            default_headers={"x-test-record": name, "X-Claw-Trajectory": trajectory},
        )

    def sent(self, name: str) -> list[dict[str, Any]]:
        return upstream_received(self.upstream, name)

    def step(self, trajectory: str) -> dict[str, Any]:
        [step] = steps_of(self.server, self.key, trajectory)
        return step

    def direct(self, sent: dict[str, Any], endpoint: str = "chat/completions") -> dict[str, Any]:
        """The upstream's whole answer to what the gateway sent it (the demo is deterministic)."""
        body = {k: v for k, v in sent.items() if k not in ("stream", "stream_options")}
        return upstream_ids(self.upstream, body, endpoint=endpoint)


def _uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _chat_values(choice: dict[str, Any]) -> list[float]:
    return [e["logprob"] for e in choice["logprobs"]["content"]]


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    """A live server with the default (CLAW_UPSTREAM_LOGPROBS on)."""
    with live_server(tmp_path_factory.mktemp("gw-lp"), {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


@pytest.fixture(scope="module")
def gw_off(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    """A live server with CLAW_UPSTREAM_LOGPROBS=0."""
    env = {"CLAW_UPSTREAM_URL": demo_upstream, "CLAW_UPSTREAM_LOGPROBS": "0"}
    with live_server(tmp_path_factory.mktemp("gw-lp-off"), env) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


# --- what is asked (in process) -------------------------------------------------------------------
def test_ask_adds_the_logprobs_fields_the_agent_did_not_set(settings):
    # given: the default setting and an upstream with no refusal remembered
    settings.CLAW_UPSTREAM_URL = "http://ask-test.invalid/v1"

    # when / then: chat without logprobs: logprobs true, top_logprobs 0, stripped from the answer
    a = fields.ask(CHAT, {"messages": MESSAGES})
    assert a.body == {"messages": MESSAGES, "return_token_ids": True, "logprobs": True, "top_logprobs": 0}
    assert a.strip_logprobs and a.strip_ids
    # and: the agent's own top_logprobs is kept (it did not ask logprobs: still stripped)
    a = fields.ask(CHAT, {"messages": MESSAGES, "top_logprobs": 2})
    assert (a.body["logprobs"], a.body["top_logprobs"], a.strip_logprobs) == (True, 2, True)
    # and: an agent that asks itself is sent as it asked and gets them back
    own = {"messages": MESSAGES, "logprobs": True, "top_logprobs": 3}
    a = fields.ask(CHAT, own)
    assert a.body == {**own, "return_token_ids": True} and not a.strip_logprobs
    # and: completions: logprobs 1, or the agent's own value (0 too)
    assert fields.ask(COMPLETIONS, {"prompt": "x"}).body["logprobs"] == 1
    for k in (0, 3):
        a = fields.ask(COMPLETIONS, {"prompt": "x", "logprobs": k})
        assert a.body["logprobs"] == k and not a.strip_logprobs


def test_ask_adds_no_logprobs_when_the_setting_is_off(settings):
    # given
    settings.CLAW_UPSTREAM_URL = "http://ask-test.invalid/v1"
    settings.CLAW_UPSTREAM_LOGPROBS = False

    # when
    chat = fields.ask(CHAT, {"messages": MESSAGES})
    completion = fields.ask(COMPLETIONS, {"prompt": "x"})

    # then: ids only; the agent's own ask still goes through
    assert chat.body == {"messages": MESSAGES, "return_token_ids": True} and not chat.strip_logprobs
    assert "logprobs" not in completion.body and not completion.strip_logprobs
    assert fields.ask(CHAT, {"messages": MESSAGES, "logprobs": True}).body["logprobs"] is True


def test_a_refused_field_goes_and_the_agents_own_value_comes_back(settings):
    # given: an agent that set logprobs false, overridden by the gateway
    settings.CLAW_UPSTREAM_URL = "http://ask-test.invalid/v1"
    a = fields.ask(CHAT, {"messages": MESSAGES, "logprobs": False})
    assert a.body["logprobs"] is True

    # when: the upstream's 400 names logprobs
    retry = a.refused(b'{"error": {"message": "logprobs is not supported", "param": "logprobs"}}')

    # then: the agent's value is back, the added top_logprobs gone, the ids kept
    assert retry and a.body == {"messages": MESSAGES, "logprobs": False, "return_token_ids": True}
    assert not a.refused(b'{"error": {"message": "logprobs is not supported"}}')  # nothing left to drop


# --- chat completions -----------------------------------------------------------------------------
@pytest.mark.live
def test_chat_stores_the_upstreams_logprobs_and_the_agent_that_did_not_ask_gets_none(gw):
    # given: an agent that does not ask for logprobs
    name, traj = _uid("chat"), _uid("lp-chat")

    # when
    raw = gw.openai(name, traj).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=24
    )

    # then: the upstream was asked for the sampled tokens' logprobs
    [sent] = gw.sent(name)
    assert (sent["logprobs"], sent["top_logprobs"], sent["return_token_ids"]) == (True, 0, True)
    # and: the agent got none, as OpenAI answers when none were asked
    assert raw.http_response.json()["choices"][0]["logprobs"] is None
    assert raw.parse().choices[0].logprobs is None
    # and: the step holds the upstream's values, one per response id
    direct = gw.direct(sent)["choices"][0]
    step = gw.step(traj)
    assert step["response_ids"] == direct["token_ids"]
    assert step["rollout_logprobs"] == _chat_values(direct)
    assert len(step["rollout_logprobs"]) == len(step["response_ids"]) > 0
    assert all(v < 0 for v in step["rollout_logprobs"]) and len(set(step["rollout_logprobs"])) > 1
    assert "missing_logprobs" not in step["quality_flags"]


@pytest.mark.live
def test_streamed_chat_stores_the_logprobs_and_no_chunk_carries_any(gw):
    # given: a raw SSE reader and an SDK agent, neither asking for logprobs
    name, traj = _uid("chat-sse"), _uid("lp-chat-sse")
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 30, "stream": True}
    headers = {**auth(gw.key), "x-test-record": name, "X-Claw-Trajectory": traj}

    # when: the raw stream is read
    chunks = []
    with httpx.stream(
        "POST", f"{gw.server.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(orjson.loads(line[6:]))

    # then: the upstream was asked (stream too), and no chunk carries logprobs values
    [sent] = gw.sent(name)
    assert (sent["logprobs"], sent["top_logprobs"], sent["stream"]) == (True, 0, True)
    choices = [c for chunk in chunks for c in chunk["choices"]]
    assert len(choices) > 4 and all(c.get("logprobs") is None for c in choices)
    # and: the step holds the stream's logprobs, the upstream's values
    direct = gw.direct(sent)["choices"][0]
    step = gw.step(traj)
    assert step["rollout_logprobs"] == _chat_values(direct)
    assert len(step["rollout_logprobs"]) == len(step["response_ids"]) == len(direct["token_ids"])

    # when: the SDK streams
    sdk_name, sdk_traj = _uid("chat-sdk-sse"), _uid("lp-chat-sdk-sse")
    sdk_chunks = list(
        gw.openai(sdk_name, sdk_traj).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=30, stream=True
        )
    )

    # then: its chunks have no logprobs; the step has them
    assert sdk_chunks and all(ch.logprobs is None for c in sdk_chunks for ch in c.choices)
    [sdk_sent] = gw.sent(sdk_name)
    assert gw.step(sdk_traj)["rollout_logprobs"] == _chat_values(gw.direct(sdk_sent)["choices"][0])


@pytest.mark.live
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_agent_that_asks_for_logprobs_gets_exactly_the_upstreams(gw, stream):
    # given: an agent that asks for logprobs with 3 alternatives per token
    name, traj = _uid("chat-ask"), _uid("lp-chat-ask")
    client = gw.openai(name, traj)
    kwargs = dict(model=MODEL, messages=MESSAGES, max_tokens=24, logprobs=True, top_logprobs=3)

    # when
    if stream:
        entries = []
        for chunk in client.chat.completions.create(**kwargs, stream=True):
            for ch in chunk.choices:
                if ch.logprobs is not None:
                    entries += [e.model_dump() for e in ch.logprobs.content]
    else:
        entries = [
            e.model_dump() for e in client.chat.completions.create(**kwargs).choices[0].logprobs.content
        ]

    # then: its own top_logprobs went upstream, and it got what the upstream answers, unchanged
    [sent] = gw.sent(name)
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 3)
    direct = gw.direct(sent)["choices"][0]
    assert entries == direct["logprobs"]["content"]
    assert all(len(e["top_logprobs"]) == 3 for e in entries)
    # and: the step stores them too
    step = gw.step(traj)
    assert step["rollout_logprobs"] == [e["logprob"] for e in entries]
    assert len(step["rollout_logprobs"]) == len(step["response_ids"])


# --- completions ----------------------------------------------------------------------------------
@pytest.mark.live
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_completions_store_the_logprobs_and_give_them_only_to_an_agent_that_asks(gw, stream):
    # given: one agent that does not ask, one that asks for 3 alternatives
    name, traj = _uid("cmpl"), _uid("lp-cmpl")
    ask_name, ask_traj = _uid("cmpl-ask"), _uid("lp-cmpl-ask")

    def call(client: openai.OpenAI, **kw) -> list[Any]:
        if stream:
            chunks = client.completions.create(model=MODEL, prompt="Once", max_tokens=20, stream=True, **kw)
            return [ch for c in chunks for ch in c.choices]
        return client.completions.create(model=MODEL, prompt="Once", max_tokens=20, **kw).choices

    # when
    plain = call(gw.openai(name, traj))
    asked = call(gw.openai(ask_name, ask_traj), logprobs=3)

    # then: the plain agent's call asked logprobs 1 upstream, and it got none
    [sent] = gw.sent(name)
    assert sent["logprobs"] == 1
    assert plain and all(ch.logprobs is None for ch in plain)
    direct = gw.direct(sent, "completions")["choices"][0]
    step = gw.step(traj)
    assert step["rollout_logprobs"] == direct["logprobs"]["token_logprobs"]
    assert len(step["rollout_logprobs"]) == len(step["response_ids"]) == len(direct["token_ids"])
    # and: the asking agent's value went upstream, and it got the upstream's logprobs unchanged
    [ask_sent] = gw.sent(ask_name)
    assert ask_sent["logprobs"] == 3
    ask_direct = gw.direct(ask_sent, "completions")["choices"][0]["logprobs"]
    got: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for ch in asked:
        for k in got:
            got[k] += getattr(ch.logprobs, k)
    assert got == ask_direct
    assert gw.step(ask_traj)["rollout_logprobs"] == ask_direct["token_logprobs"]


# --- the doors ------------------------------------------------------------------------------------
@pytest.mark.live
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_messages_door_stores_the_logprobs(gw, stream):
    # given: an unmodified Anthropic SDK agent
    name, traj = _uid("messages"), _uid("lp-messages")
    client = gw.anthropic(name, traj)
    kwargs = dict(model=MODEL, max_tokens=30, system="You are terse.", messages=[MESSAGES[1]])

    # when
    if stream:
        with client.messages.stream(**kwargs) as s:
            reply = s.get_final_message()
    else:
        reply = client.messages.create(**kwargs)

    # then: the translated chat call asked for logprobs, and the step holds the upstream's
    _asked_and_stored(gw, name, traj, stream=stream, output_tokens=reply.usage.output_tokens)


@pytest.mark.live
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_responses_door_stores_the_logprobs(gw, stream):
    # given: an OpenAI Responses agent
    name, traj = _uid("responses"), _uid("lp-responses")
    client = gw.openai(name, traj)
    kwargs = dict(model=MODEL, instructions="You are terse.", input="Say hi.", max_output_tokens=30)

    # when
    if stream:
        with client.responses.stream(**kwargs) as s:
            reply = s.get_final_response()
    else:
        reply = client.responses.create(**kwargs)

    # then: the translated chat call asked for logprobs, and the step holds the upstream's
    _asked_and_stored(gw, name, traj, stream=stream, output_tokens=reply.usage.output_tokens)


def _asked_and_stored(gw, name: str, traj: str, *, stream: bool, output_tokens: int) -> None:
    """The one chat call a translating door sent upstream asked for the sampled tokens'
    logprobs (and streamed as the agent did), and the stored step holds exactly the
    upstream's, one per response id, unflagged."""
    [sent] = gw.sent(name)
    assert (sent["logprobs"], sent["top_logprobs"], sent["messages"]) == (True, 0, MESSAGES)
    assert sent.get("stream", False) is stream
    direct = gw.direct(sent)["choices"][0]
    step = gw.step(traj)
    assert step["rollout_logprobs"] == _chat_values(direct)
    assert len(step["rollout_logprobs"]) == len(step["response_ids"]) == output_tokens
    assert "missing_logprobs" not in step["quality_flags"]


# --- Claw-R1 /generate ----------------------------------------------------------------------------
@pytest.mark.live
def test_claw_r1_generate_returns_the_logprobs_unasked_and_the_submitted_step_stores_them(gw):
    # given: a white-box flow that does not ask for logprobs
    name, traj = _uid("generate"), _uid("lp-generate")
    prompt_ids = [1, 10, 20, 30, 40]
    headers = {**auth(gw.key), "x-test-record": name}

    # when: it generates, then submits the step with what it got
    gen = httpx.post(
        f"{gw.server.url}/compat/claw-r1/generate",
        json={"prompt_ids": prompt_ids, "sampling_params": {"max_tokens": 16}},
        headers=headers,
        timeout=30,
    ).json()
    step = {
        "prompt_ids": prompt_ids,
        "response_ids": gen["token_ids"],
        "rollout_log_probs": gen["log_probs"],
        "trajectory_uid": traj,
        "step_index": 0,
    }
    r = httpx.post(
        f"{gw.server.url}/compat/claw-r1/submit_steps",
        json={"steps": [step]},
        headers=auth(gw.key),
        timeout=30,
    )

    # then: the upstream was asked logprobs 1, /generate returned its values, the step stores them
    [sent] = gw.sent(name)
    assert (sent["logprobs"], sent["return_token_ids"]) == (1, True)
    direct = gw.direct(sent, "completions")["choices"][0]
    assert gen["token_ids"] == direct["token_ids"]
    assert gen["log_probs"] == direct["logprobs"]["token_logprobs"]
    assert r.status_code == 200
    stored = gw.step(traj)
    assert stored["rollout_logprobs"] == gen["log_probs"]
    assert len(stored["rollout_logprobs"]) == len(stored["response_ids"]) > 0


# --- CLAW_UPSTREAM_LOGPROBS=0 ---------------------------------------------------------------------
@pytest.mark.live
def test_with_the_setting_off_the_upstream_is_not_asked_and_steps_are_flagged(gw_off):
    # given: agents through every door, none asking for logprobs
    gw = gw_off
    calls = {}

    # when
    for door in ("chat", "chat-sse", "completions", "messages", "responses"):
        name, traj = _uid(door), _uid(f"lp-off-{door}")
        calls[door] = (name, traj)
        if door == "chat":
            gw.openai(name, traj).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16)
        elif door == "chat-sse":
            list(
                gw.openai(name, traj).chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=16, stream=True
                )
            )
        elif door == "completions":
            gw.openai(name, traj).completions.create(model=MODEL, prompt="Once", max_tokens=16)
        elif door == "messages":
            gw.anthropic(name, traj).messages.create(model=MODEL, max_tokens=16, messages=[MESSAGES[1]])
        else:
            gw.openai(name, traj).responses.create(model=MODEL, input="Say hi.", max_output_tokens=16)

    # then: no logprobs field went upstream; the steps have none and are flagged
    for door, (name, traj) in calls.items():
        [sent] = gw.sent(name)
        assert "logprobs" not in sent and "top_logprobs" not in sent, door
        assert sent["return_token_ids"] is True, door
        step = gw.step(traj)
        assert step["rollout_logprobs"] is None and "missing_logprobs" in step["quality_flags"], door


@pytest.mark.live
def test_with_the_setting_off_an_agent_that_asks_still_gets_and_stores_them(gw_off):
    # given
    name, traj = _uid("off-ask"), _uid("lp-off-ask")

    # when
    reply = gw_off.openai(name, traj).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=16, logprobs=True
    )

    # then
    [sent] = gw_off.sent(name)
    assert sent["logprobs"] is True and "top_logprobs" not in sent
    values = [e.logprob for e in reply.choices[0].logprobs.content]
    assert values == _chat_values(gw_off.direct(sent)["choices"][0])
    assert gw_off.step(traj)["rollout_logprobs"] == values


@pytest.mark.live
def test_with_the_setting_off_generate_returns_no_logprobs_unasked(gw_off):
    name = _uid("off-generate")
    r = httpx.post(
        f"{gw_off.server.url}/compat/claw-r1/generate",
        json={"prompt_ids": [1, 10, 20], "sampling_params": {"max_tokens": 8}},
        headers={**auth(gw_off.key), "x-test-record": name},
        timeout=30,
    )
    [sent] = gw_off.sent(name)
    assert "logprobs" not in sent
    assert r.status_code == 200 and r.json()["log_probs"] is None and r.json()["token_ids"]


# --- an upstream that refuses logprobs ------------------------------------------------------------
@pytest.mark.live
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_upstream_that_refuses_logprobs_is_asked_again_without_them_and_remembered(
    tmp_path, demo_upstream, stream
):
    # given: a fresh gateway (nothing remembered) before an upstream that refuses logprobs
    with live_server(tmp_path, {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        gw = Gateway(server, server.make_key("ingest", "read"), demo_upstream)
        refuse = {"x-test-refuse": "logprobs"}

        def chat(name: str, traj: str, **headers: str) -> openai.OpenAI:
            client = gw.openai(name, traj, **headers)
            kwargs = dict(model=MODEL, messages=MESSAGES, max_tokens=16)
            if stream:
                return "".join(
                    c.choices[0].delta.content or ""
                    for c in client.chat.completions.create(**kwargs, stream=True)
                    if c.choices
                )
            return client.chat.completions.create(**kwargs).choices[0].message.content

        # when: a 400 names logprobs but the call fails without them too (another fault)
        bad_name, bad_traj = _uid("refuse-bad"), _uid("lp-refuse-bad")
        with pytest.raises(openai.BadRequestError):
            chat(bad_name, bad_traj, **refuse, **{"x-demo-fail": "400"})

        # then: it was asked again once without them, the error passed on, nothing remembered
        first, second = gw.sent(bad_name)
        assert first["logprobs"] is True and "logprobs" not in second and "top_logprobs" not in second
        assert steps_of(gw.server, gw.key, bad_traj) == []

        # when: the upstream refuses logprobs and answers without them
        name, traj = _uid("refuse"), _uid("lp-refuse")
        text = chat(name, traj, **refuse)

        # then: asked, refused, asked again without them; the agent got its answer
        first, second = gw.sent(name)
        assert (first["logprobs"], first["top_logprobs"]) == (True, 0)
        assert "logprobs" not in second and "top_logprobs" not in second
        assert second["return_token_ids"] is True
        # and: the step is stored without logprobs, flagged
        step = gw.step(traj)
        assert step["response_text"] == text and step["token_source"] == "upstream"
        assert step["rollout_logprobs"] is None and "missing_logprobs" in step["quality_flags"]

        # when: the next call, through a door this time
        later, later_traj = _uid("refuse-later"), _uid("lp-refuse-later")
        gw.anthropic(later, later_traj).messages.create(model=MODEL, max_tokens=16, messages=[MESSAGES[1]])

        # then: the refusal is remembered: one request, without logprobs
        [sent] = gw.sent(later)
        assert "logprobs" not in sent and sent["return_token_ids"] is True
        assert "missing_logprobs" in gw.step(later_traj)["quality_flags"]
