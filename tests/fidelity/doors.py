"""The doors of the fidelity matrix (tests/test_fidelity_matrix.py) as agents use them, and
the ways a reward reaches what they wrote.

Each door runs one rollout (TURNS steps) of a prompt group and returns what its source sent:
white-box doors the steps they submitted; black-box doors the span of the upstream's request
log their calls made (tests/fidelity/recording_upstream.py), turned into the token ids and
logprobs the upstream produced by ``upstream_truth`` once everything is written. Then
``reward_arrive`` brings the rollout's reward the scenario's way. Everything goes over HTTP to
a live server, through the clients agents use: the official ``openai`` and ``anthropic``
SDKs, ``claw_client.ClawClient``, and Claw-R1's exact HTTP calls.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from claw_client import ClawClient
from tests.fidelity import recording_upstream

TURNS = 3
MODEL = "claw-demo"
SYSTEM = "You are terse."
TOOL_RESULT = "42"
CHAT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look it up",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]
ANTHROPIC_TOOLS = [
    {
        "name": "lookup",
        "description": "Look it up",
        "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }
]
RESPONSES_TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look it up",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    }
]
# claw_r1/agent_flow/multi_step_agent_flow.py
FEEDBACK_PROMPT = (
    "Please verify your answer step by step and provide the final answer again in the format #### <number>."
)
CLAW_R1_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, "logprobs": True}
GSM8K_FIELDS = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42", "style": "rule"}}

WHITE_BOX = ("wb_json", "wb_msgpack", "clawr1_wb")
BLACK_BOX = ("oa_chat", "oa_chat_stream", "anthropic", "responses", "clawr1_bb")
# Reward paths: own rewards on the submitted steps (white-box only), then the late ones.
ON_STEPS = ("step_each", "step_last")
LATER = ("late", "trajectory", "computed", "human", "clawr1_complete")
# The reward_source of the effective reward, by path.
SOURCE = {
    "step_each": "env",
    "step_last": "env",
    "late": "env",
    "trajectory": "env",
    "computed": "rule",
    "human": "human",
    "clawr1_complete": "env",
}
# Where the effective reward of a step that is not the last comes from, by path (each_step).
OTHERS_SCOPE = {
    "step_last": "branch",
    "late": "branch",
    "trajectory": "trajectory",
    "computed": "branch",
    "human": "trajectory",
    "clawr1_complete": "branch",
}


@dataclass(frozen=True)
class Scenario:
    door: str
    reward: str
    index: int  # its place in the whole table (seeds, policy versions)

    @property
    def id(self) -> str:
        return f"{self.door}-{self.reward}"

    @property
    def group_uid(self) -> str:
        return f"{self.id}-g"

    def trajectory_uid(self, r: int) -> str:
        return f"{self.id}-r{r}"

    def policy_version(self, r: int) -> int:
        return 10 * (self.index + 1) + r

    def reward_of(self, r: int) -> float:
        """The reward rollout ``r`` ends with: gsm8k scores for the scripted answers where a
        reward function scores it, else 1.0 and 0.25 (so two rollouts never share one)."""
        if self.scored:
            return (1.0, 0.0)[r]
        return (1.0, 0.25)[r]

    def own_reward(self, r: int, i: int) -> float:
        """step_each: step ``i``'s own reward."""
        return round(0.1 * (i + 1) + 0.5 * r, 2)

    def answer(self, r: int) -> str:
        """The scripted answer of rollout ``r`` (where one is scripted)."""
        return ("#### 42", "#### 41")[r]

    @property
    def scored(self) -> bool:
        """Whether a gsm8k function scores it (the pool's, or Claw-R1's compute_reward)."""
        return self.reward == "computed" or (self.door == "clawr1_wb" and self.reward == "step_last")

    @property
    def scripted(self) -> bool:
        """Whether the upstream answers the scripted text (gsm8k), not tool calls."""
        return self.reward == "computed" or self.door == "clawr1_wb"


@dataclass
class Sent:
    """One step as its source sent it (white-box), or as the upstream produced it."""

    trajectory_uid: str
    step_index: int
    prompt_group_uid: str
    policy_version: int
    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float] | None


@dataclass
class Rollout:
    r: int
    trajectory_uid: str
    steps: list[Sent] = field(default_factory=list)
    calls: tuple[int, int] | None = None  # black-box: its span of the upstream's request log
    base_url: str | None = None  # Claw-R1's capability URL (clawr1_bb)


@dataclass
class Gateway:
    """The live server, its keys and the recording upstream."""

    url: str
    agent_key: str  # ingest + read
    human_key: str  # ingest + read; its source is the one the review queue serves
    upstream: str  # ".../v1"
    record: Path

    def key_for(self, sc: Scenario) -> str:
        return self.human_key if sc.reward == "human" else self.agent_key

    def claw(self, sc: Scenario) -> ClawClient:
        return ClawClient(self.url, self.key_for(sc))

    def log_length(self) -> int:
        return len(recording_upstream.recorded(self.record))


# --- one rollout through a door ---------------------------------------------------------------
def rollout_run(gw: Gateway, sc: Scenario, r: int) -> Rollout:
    """Rollout ``r`` of scenario ``sc`` through its door (the reward not yet arrived unless it
    rides on the steps)."""
    ro = Rollout(r=r, trajectory_uid=sc.trajectory_uid(r))
    if sc.door in ("wb_json", "wb_msgpack"):
        _white_box(gw, sc, ro)
        return ro
    if sc.door == "clawr1_wb":
        _claw_r1_white_box(gw, sc, ro)
        return ro
    start = gw.log_length()
    if sc.door == "clawr1_bb":
        _claw_r1_black_box(gw, sc, ro)
    else:
        base = f"{gw.url}/t/{ro.trajectory_uid}/{sc.group_uid}"
        headers = {"X-Claw-Policy-Version": str(sc.policy_version(r))}
        if sc.door == "anthropic":
            client = anthropic.Anthropic(
                base_url=base, api_key=gw.key_for(sc), max_retries=0, timeout=60, default_headers=headers
            )
            _anthropic_agent(client, sc, r)
        else:
            client = openai.OpenAI(
                base_url=f"{base}/v1",
                api_key=gw.key_for(sc),
                max_retries=0,
                timeout=60,
                default_headers=headers,
            )
            if sc.door == "responses":
                _responses_agent(client, sc, r)
            else:
                _chat_agent(client, sc, r, stream=sc.door == "oa_chat_stream")
    ro.calls = (start, gw.log_length())
    return ro


def _ends_with_is_last(sc: Scenario) -> bool:
    """White-box: whether the last step is submitted with is_last (the trajectory ends with
    it), or the trajectory is ended later by a completion carrying the reward."""
    return sc.reward not in ("trajectory", "clawr1_complete")


def _white_box(gw: Gateway, sc: Scenario, ro: Rollout) -> None:
    """POST /api/v1/steps (JSON, or MessagePack packed by claw_client), one batch: prompts
    that extend the previous prompt + response, the group's shared prompt first."""
    rng = random.Random(1000 * sc.index + ro.r)
    prompt = [random.Random(sc.index).randrange(1, 150_000) for _ in range(40)]
    steps = []
    for i in range(TURNS):
        response = [rng.randrange(1, 150_000) for _ in range(5 + (i + ro.r) % 4)]
        sent = Sent(
            trajectory_uid=ro.trajectory_uid,
            step_index=i,
            prompt_group_uid=sc.group_uid,
            policy_version=sc.policy_version(ro.r),
            prompt_ids=list(prompt),
            response_ids=response,
            rollout_logprobs=[-rng.random() * 3 for _ in response],
        )
        ro.steps.append(sent)
        last = i == TURNS - 1
        step: dict[str, Any] = {
            "uid": f"{ro.trajectory_uid}:{i}",
            "trajectory_uid": sent.trajectory_uid,
            "prompt_group_uid": sent.prompt_group_uid,
            "step_index": i,
            "prompt_ids": sent.prompt_ids,
            "response_ids": sent.response_ids,
            "rollout_logprobs": sent.rollout_logprobs,
            "policy_version": sent.policy_version,
            "is_last": last and _ends_with_is_last(sc),
        }
        if sc.reward == "step_each":
            step["reward"] = sc.own_reward(ro.r, i)
        elif sc.reward == "step_last" and last:
            step["reward"] = sc.reward_of(ro.r)
        if sc.reward == "computed" and last:
            step["response_text"] = sc.answer(ro.r)  # what the group's gsm8k function scores
        steps.append(step)
        prompt = prompt + response + [rng.randrange(1, 150_000) for _ in range(3)]
    with gw.claw(sc) as claw:
        result = claw.submit_steps(steps, msgpack=sc.door == "wb_msgpack")
    assert result["created"] == TURNS, result


def _claw_r1_white_box(gw: Gateway, sc: Scenario, ro: Rollout) -> None:
    """Claw-R1's MultiStepAgentFlow, call for call: tokenize with the served model's tokenizer,
    POST {gateway_url}/generate, then submit_steps one step per turn (Claw-R1's StepPayload);
    the reward on the last step from /compute_reward (step_last), Claw-R1's own shape."""
    gateway_url = f"{gw.url}/compat/claw-r1/k/{gw.key_for(sc)}"
    root = gw.upstream.removesuffix("/v1")
    direct = {recording_upstream.DIRECT_HEADER: "1"}
    messages = [{"role": "user", "content": f"What is 6 * 7? [demo-reply]{sc.answer(ro.r)}"}]
    metadata = dict(GSM8K_FIELDS) if sc.reward in ("computed", "step_last") else {}
    for turn in range(TURNS):
        prompt_ids = httpx.post(
            f"{root}/tokenize",
            json={"messages": messages, "add_generation_prompt": True},
            headers=direct,
            timeout=30,
        ).json()["tokens"]
        gen = httpx.post(
            f"{gateway_url}/generate",
            json={"prompt_ids": prompt_ids, "sampling_params": CLAW_R1_SAMPLING},
            timeout=60,
        )
        assert gen.status_code == 200, gen.text
        out = gen.json()
        last = turn == TURNS - 1
        reward = None
        if sc.reward == "step_each":
            reward = sc.own_reward(ro.r, turn)
        elif sc.reward == "step_last" and last:
            scored = httpx.post(
                f"{gateway_url}/compute_reward",
                json={
                    "prompt_ids": prompt_ids,
                    "response_ids": out["token_ids"],
                    "num_turns": len(messages),
                    "extra_fields": {},
                    "dataset_fields": metadata,
                },
                timeout=60,
            )
            assert scored.status_code == 200, scored.text
            reward = scored.json()["reward_score"]
            assert reward == sc.reward_of(ro.r), scored.json()
        payload = {
            "prompt_ids": prompt_ids,
            "response_ids": out["token_ids"],
            "reward": reward,
            "rollout_log_probs": out["log_probs"],
            "trajectory_uid": ro.trajectory_uid,
            "prompt_uid": sc.group_uid,
            "step_index": turn,
            "policy_version": sc.policy_version(ro.r),
            "is_last": last and _ends_with_is_last(sc),
            "metadata": metadata,
        }
        done = httpx.post(f"{gateway_url}/submit_steps", json={"steps": [payload]}, timeout=60)
        assert done.status_code == 200 and done.json() == {"accepted": 1}, done.text
        ro.steps.append(
            Sent(
                trajectory_uid=ro.trajectory_uid,
                step_index=turn,
                prompt_group_uid=sc.group_uid,
                policy_version=sc.policy_version(ro.r),
                prompt_ids=prompt_ids,
                response_ids=out["token_ids"],
                rollout_logprobs=out["log_probs"],
            )
        )
        text = httpx.post(
            f"{root}/detokenize", json={"tokens": out["token_ids"]}, headers=direct, timeout=30
        ).json()["prompt"]
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": FEEDBACK_PROMPT}]


def _claw_r1_black_box(gw: Gateway, sc: Scenario, ro: Rollout) -> None:
    """Claw-R1's black-box flow: init_trajectory (no body), the prompt uid of its base URL
    replaced by the real one (as Claw-R1's flow does), register with the policy version in
    its metadata, then the official openai client at the base URL."""
    init = httpx.post(
        f"{gw.url}/compat/claw-r1/init_trajectory",
        headers={"Authorization": f"Bearer {gw.key_for(sc)}"},
        timeout=30,
    )
    assert init.status_code == 200, init.text
    ro.trajectory_uid = init.json()["trajectory_uid"]
    head, _default_prompt_uid, v1 = init.json()["base_url"].rstrip("/").rsplit("/", 2)
    ro.base_url = f"{head}/{sc.group_uid}/{v1}"
    reg = httpx.post(
        f"{ro.base_url}/register_trajectory",
        json={"channel": "train", "metadata": {"policy_version": sc.policy_version(ro.r)}},
        timeout=30,
    )
    assert reg.status_code == 200 and reg.json() == {"status": "ok"}, reg.text
    client = openai.OpenAI(base_url=ro.base_url, api_key="not-needed", max_retries=0, timeout=60)
    _chat_agent(client, sc, ro.r, stream=False)


# --- black-box agents -------------------------------------------------------------------------
def _chat_agent(client: openai.OpenAI, sc: Scenario, r: int, *, stream: bool) -> None:
    """TURNS chat calls. Tool use: the model calls the tool, gets its result in a tool
    message, answers, is asked again (and calls it again). Scripted (gsm8k): every user
    message asks for the rollout's answer."""
    if sc.scripted:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Turn 0. [demo-reply]{sc.answer(r)}"}]
        tools: dict[str, Any] = {}
    else:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _ask(r)}]
        tools = {"tools": CHAT_TOOLS}
    for turn in range(TURNS):
        if stream:
            chunks = client.chat.completions.create(
                model=MODEL, messages=messages, max_tokens=48, stream=True, **tools
            )
            reply = _assembled(chunks)
        else:
            out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, **tools)
            reply = out.choices[0].message.model_dump(exclude_none=True)
        messages.append(reply)
        if reply.get("tool_calls"):
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": TOOL_RESULT} for c in reply["tool_calls"]
            ]
        elif sc.scripted:
            messages.append({"role": "user", "content": f"Turn {turn + 1}. [demo-reply]{sc.answer(r)}"})
        else:
            messages.append({"role": "user", "content": "Once more."})


def _ask(r: int) -> str:
    """The task of rollout ``r``: the rollouts of a group differ, so the upstream's answers
    (a pure function of the prompt) differ too, and a row given another rollout's ids shows."""
    return f"Use the tool. Attempt {r}."


def _assembled(chunks: Any) -> dict[str, Any]:
    """The assistant message of a streamed chat answer (text deltas and tool-call deltas)."""
    text: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
        for tc in delta.tool_calls or ():
            slot = calls.setdefault(
                tc.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            if tc.id:
                slot["id"] = tc.id
            if tc.function is not None:
                slot["function"]["name"] += tc.function.name or ""
                slot["function"]["arguments"] += tc.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def _anthropic_agent(client: anthropic.Anthropic, sc: Scenario, r: int) -> None:
    """TURNS Messages calls: tool_use, its tool_result, text, asked again (tool_use again);
    scripted: every user message asks for the rollout's answer."""
    if sc.scripted:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"Turn 0. [demo-reply]{sc.answer(r)}"}]
        extra: dict[str, Any] = {}
    else:
        messages = [{"role": "user", "content": _ask(r)}]
        extra = {"system": SYSTEM, "tools": ANTHROPIC_TOOLS}
    for turn in range(TURNS):
        reply = client.messages.create(model=MODEL, max_tokens=48, messages=messages, **extra)
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        uses = [b for b in reply.content if b.type == "tool_use"]
        if uses:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": b.id, "content": TOOL_RESULT} for b in uses
                    ],
                }
            )
        elif sc.scripted:
            messages.append({"role": "user", "content": f"Turn {turn + 1}. [demo-reply]{sc.answer(r)}"})
        else:
            messages.append({"role": "user", "content": "Once more."})


def _responses_agent(client: openai.OpenAI, sc: Scenario, r: int) -> None:
    """TURNS Responses calls chained by previous_response_id (the instructions sent again
    each time, as they are not carried over): function_call, its output, a message, asked
    again; scripted: every input asks for the rollout's answer."""
    if sc.scripted:
        extra: dict[str, Any] = {}
        next_input: Any = f"Turn 0. [demo-reply]{sc.answer(r)}"
    else:
        extra = {"instructions": SYSTEM, "tools": RESPONSES_TOOLS}
        next_input = _ask(r)
    previous = None
    for turn in range(TURNS):
        chained = {"previous_response_id": previous} if previous else {}
        resp = client.responses.create(
            model=MODEL, input=next_input, max_output_tokens=48, **chained, **extra
        )
        previous = resp.id
        calls = [o for o in resp.output if o.type == "function_call"]
        if calls:
            next_input = [
                {"type": "function_call_output", "call_id": c.call_id, "output": TOOL_RESULT} for c in calls
            ]
        elif sc.scripted:
            next_input = f"Turn {turn + 1}. [demo-reply]{sc.answer(r)}"
        else:
            next_input = "Once more."


# --- what the upstream produced ---------------------------------------------------------------
def upstream_truth(gw: Gateway, sc: Scenario, ro: Rollout, log: list[dict[str, Any]]) -> list[str]:
    """Fill ``ro.steps`` of a black-box rollout with what the upstream produced for each of
    its calls: the logged request asked again directly, with return_token_ids and logprobs
    (the answer is a pure function of the request, so the ids are those it produced, and
    the logprobs those it computed for them). Returns problems (a count that differs)."""
    assert ro.calls is not None
    calls = log[ro.calls[0] : ro.calls[1]]
    problems = []
    if len(calls) != TURNS:
        problems.append(
            f"r{ro.r}: the upstream received {len(calls)} completion requests for {TURNS} agent calls"
        )
    root = gw.upstream.removesuffix("/v1")
    for i, call in enumerate(calls):
        body = {k: v for k, v in call["body"].items() if k not in ("stream", "stream_options")}
        chat = call["path"].endswith("/chat/completions")
        body.update(return_token_ids=True, logprobs=True if chat else 1)
        answer = httpx.post(
            f"{root}{call['path']}", json=body, headers={recording_upstream.DIRECT_HEADER: "1"}, timeout=30
        )
        answer.raise_for_status()
        choice = answer.json()["choices"][0]
        if chat:
            prompt = answer.json()["prompt_token_ids"]
            logprobs = [t["logprob"] for t in choice["logprobs"]["content"]]
        else:
            prompt = choice["prompt_token_ids"]
            logprobs = choice["logprobs"]["token_logprobs"]
        ro.steps.append(
            Sent(
                trajectory_uid=ro.trajectory_uid,
                step_index=i,
                prompt_group_uid=sc.group_uid,
                policy_version=sc.policy_version(ro.r),
                prompt_ids=prompt,
                response_ids=choice["token_ids"],
                rollout_logprobs=logprobs,
            )
        )
    return problems


# --- how the reward arrives -------------------------------------------------------------------
def reward_arrive(gw: Gateway, sc: Scenario, rollouts: list[Rollout]) -> None:
    """After the rollouts of ``sc``: end them and bring the reward the scenario's way (for
    ``human``, only end them: the review comes later, tests/test_fidelity_matrix.py)."""
    if sc.reward in ON_STEPS:
        return  # it rode on the submitted steps
    with gw.claw(sc) as claw:
        for ro in rollouts:
            _end(gw, claw, sc, ro)
        if sc.reward == "late":
            uids = [_last_step_uid(claw, ro) for ro in rollouts]
            claw.rewards(
                {"step_uid": u, "reward": sc.reward_of(ro.r)} for u, ro in zip(uids, rollouts, strict=True)
            )


def _end(gw: Gateway, claw: ClawClient, sc: Scenario, ro: Rollout) -> None:
    if sc.reward == "clawr1_complete":
        url = (
            ro.base_url or f"{gw.url}/compat/claw-r1/k/{gw.key_for(sc)}/{ro.trajectory_uid}/{sc.group_uid}/v1"
        )
        done = httpx.post(f"{url}/complete_trajectory", json={"reward": sc.reward_of(ro.r)}, timeout=30)
        assert done.status_code == 200 and done.json() == {"status": "ok"}, done.text
        return
    if sc.reward == "trajectory":
        claw.complete_trajectory(ro.trajectory_uid, reward=sc.reward_of(ro.r))
        return
    # late, computed, human: ended without a reward
    if sc.door in WHITE_BOX:
        return  # by its is_last step
    if ro.base_url is not None:  # Claw-R1's flow ends its own trajectories
        done = httpx.post(f"{ro.base_url}/complete_trajectory", json={}, timeout=30)
        assert done.status_code == 200, done.text
    else:
        claw.complete_trajectory(ro.trajectory_uid)


def _last_step_uid(claw: ClawClient, ro: Rollout) -> str:
    steps = claw.http.get("/steps", params={"trajectory_uid": ro.trajectory_uid}).raise_for_status().json()
    return max(steps["results"], key=lambda s: s["step_index"])["uid"]
