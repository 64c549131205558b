"""The agents: unmodified ``openai`` SDK clients that call a tool, then answer.

Each rollout is two chat calls: the model calls ``lookup`` (the user asks it to), the tool's
result (the task's code, a digit) is appended as a ``tool`` message, and the model answers.
Through the middleware the agent's base URL is the gateway's scoped trajectory URL
``{site}/t/{trajectory}/{group}/v1`` (docs/api.md), with the serving policy's version in
``X-Claw-Policy-Version``; the agent then completes its trajectory without a reward, and the
pool's verifier (``exact``: pool/rewards/builtin.py) scores the answer against the group's
ground truth. The direct baseline (``direct_rollout``) asks the policy server itself for the
ids and logprobs (``return_token_ids``, as vLLM) and scores with the same function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from openai import OpenAI

from pool.rewards.base import RewardSample
from pool.rewards.builtin import exact_match

MODEL = "claw-learning"
REWARD_FUNCTION = "exact"  # the pool's name for pool.rewards.builtin.exact_match
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Returns the code of the task.",
        "parameters": {"type": "object", "properties": {}},
    },
}
QUESTION = "Call lookup, then answer with the code it returns."


@dataclass
class Timings:
    """Seconds the agents spent waiting on model calls and on the middleware's own API."""

    model_calls: int = 0
    model_call_s: float = 0.0  # agent-side wall of each chat call (gateway + upstream)
    api_s: float = 0.0  # open_group, complete_trajectory, sample_tasks
    api: dict[str, float] = field(default_factory=dict)

    def add_api(self, name: str, seconds: float) -> None:
        self.api_s += seconds
        self.api[name] = self.api.get(name, 0.0) + seconds


def run_agent(
    client: OpenAI, code: str, timings: Timings, *, extra_body: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One rollout: the tool call, the tool's result, the answer. Returns the two completions.
    ``extra_body``: the direct baseline asks for vLLM's ``return_token_ids`` and logprobs (through the
    gateway the agent sends nothing extra: the gateway asks for both itself)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    out = []
    for _turn in range(2):
        t0 = time.perf_counter()
        resp = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=[LOOKUP],
            max_tokens=64,
            extra_body=extra_body,
        )
        timings.model_call_s += time.perf_counter() - t0
        timings.model_calls += 1
        out.append(resp.model_dump())
        msg = resp.choices[0].message
        if not msg.tool_calls:
            break
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls:  # the environment: lookup returns the task's code
            messages.append({"role": "tool", "tool_call_id": call.id, "content": code})
    return out


def gateway_group(
    claw: Any,
    *,
    site: str,
    api_key: str,
    http: httpx.Client,
    task: dict[str, Any],
    group: str,
    rollouts: int,
    version: int,
    timings: Timings,
) -> None:
    """One prompt group of ``task`` through the gateway: declare it (task, verifier, ground
    truth, rollouts expected), run ``rollouts`` agents on its trajectory URLs, complete each
    trajectory without a reward (the pool's verifier scores it)."""
    t0 = time.perf_counter()
    claw.open_group(
        group,
        expected_rollouts=rollouts,
        task=task["uid"],
        dataset=REWARD_FUNCTION,
        ground_truth=task["ground_truth"],
    )
    timings.add_api("open_group", time.perf_counter() - t0)
    for r in range(rollouts):
        traj = f"{group}-r{r}"
        client = OpenAI(
            base_url=f"{site}/t/{traj}/{group}/v1",
            api_key=api_key,
            http_client=http,
            max_retries=0,
            default_headers={"X-Claw-Policy-Version": str(version)},
        )
        run_agent(client, str(task["metadata"]["code"]), timings)
        t0 = time.perf_counter()
        claw.complete_trajectory(traj)
        timings.add_api("complete_trajectory", time.perf_counter() - t0)


def direct_group(
    *, policy_url: str, http: httpx.Client, task: dict[str, Any], group: str, rollouts: int, timings: Timings
) -> list[dict[str, Any]]:
    """The baseline: the same agents straight at the policy server (no gateway, no pool).
    Returns the rollouts' steps as trainer rows (the ``steps`` format's fields), scored here
    by the pool's verifier function."""
    client = OpenAI(base_url=f"{policy_url}/v1", api_key="none", http_client=http, max_retries=0)
    rows = []
    for r in range(rollouts):
        completions = run_agent(
            client,
            str(task["metadata"]["code"]),
            timings,
            extra_body={"return_token_ids": True, "logprobs": True},
        )
        rows += rollout_rows(completions, task, group, f"{group}-r{r}")
    return rows


def local_group(policy: Any, *, task: dict[str, Any], group: str, rollouts: int) -> list[dict[str, Any]]:
    """The same rollouts with the policy server's ``complete`` called in-process (no HTTP):
    the fast path of the suite's learning test."""
    rows = []
    for r in range(rollouts):
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        completions = []
        for _turn in range(2):
            body = {
                "model": MODEL,
                "messages": messages,
                "tools": [LOOKUP],
                "return_token_ids": True,
                "logprobs": True,
            }
            resp, _version = policy.complete(body)
            completions.append(resp)
            msg = resp["choices"][0]["message"]
            if not msg.get("tool_calls"):
                break
            messages.append(msg)
            messages += [
                {"role": "tool", "tool_call_id": c["id"], "content": str(task["metadata"]["code"])}
                for c in msg["tool_calls"]
            ]
        rows += rollout_rows(completions, task, group, f"{group}-r{r}")
    return rows


def rollout_rows(
    completions: list[dict[str, Any]], task: dict[str, Any], group: str, traj: str
) -> list[dict[str, Any]]:
    """A rollout's steps as trainer rows: the ids and logprobs the server returned, the
    verifier's reward on the last step (the pool puts an outcome reward there too)."""
    rows = []
    for i, c in enumerate(completions):
        choice = c["choices"][0]
        last = i == len(completions) - 1
        text = choice["message"].get("content") or ""
        reward = exact_match(RewardSample(REWARD_FUNCTION, text, task["ground_truth"])).score
        rows.append(
            {
                "uid": f"{traj}:{i}",
                "trajectory_uid": traj,
                "prompt_group_uid": group,
                "step_index": i,
                "prompt_ids": c["prompt_token_ids"],
                "response_ids": choice["token_ids"],
                "rollout_logprobs": [t["logprob"] for t in choice["logprobs"]["content"]],
                "reward": reward if last else None,
                "mask": False,
            }
        )
    return rows
