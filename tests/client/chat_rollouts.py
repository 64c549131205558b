"""Chat rollouts as an agent sends them (POST /api/v1/groups and /api/v1/steps bodies), and
the conversation each one is, for the TRL export tests.

Group ``math`` (3 rollouts, rewards 1.0 / 0.2 / 0.0): ``math-r0`` calls a tool in its first
step and answers in its second (whose ``messages`` hold the tool call and the ``tool``
message); the others answer at once. Group ``greet`` (2 rollouts, both 0.5: a tie). ``solo``
is a trajectory without a group (0.9).
"""

from __future__ import annotations

from typing import Any

QUESTION = {"role": "user", "content": "what is two plus three"}
GREETING = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "2+3"}'}}
TOOL_TURN = [
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "five"},
]
GROUPS = [{"uid": "math", "expected_rollouts": 3}, {"uid": "greet", "expected_rollouts": 2}]

# trajectory -> (group, reward, the conversation it is: final step's messages + its reply)
ROLLOUTS: dict[str, tuple[str | None, float, list[dict[str, Any]]]] = {
    "math-r0": ("math", 1.0, [QUESTION, *TOOL_TURN, {"role": "assistant", "content": "the answer is five"}]),
    "math-r1": ("math", 0.2, [QUESTION, {"role": "assistant", "content": "four"}]),
    "math-r2": ("math", 0.0, [QUESTION, {"role": "assistant", "content": "three"}]),
    "greet-r0": ("greet", 0.5, [GREETING, {"role": "assistant", "content": "yo"}]),
    "greet-r1": ("greet", 0.5, [GREETING, {"role": "assistant", "content": "hi"}]),
    "solo": (None, 0.9, [QUESTION, {"role": "assistant", "content": "five"}]),
}


def steps() -> list[dict[str, Any]]:
    """The POST /api/v1/steps body's steps: one step per assistant reply, the last rewarded."""
    out: list[dict[str, Any]] = []
    for traj, (group, reward, convo) in ROLLOUTS.items():
        replies = [i for i, m in enumerate(convo) if m["role"] == "assistant"]
        prompt = [1, 2, 3]
        for n, at in enumerate(replies):
            reply = convo[at]
            last = n == len(replies) - 1
            step: dict[str, Any] = {
                "uid": f"{traj}:{n}",
                "trajectory_uid": traj,
                "prompt_group_uid": group,
                "step_index": n,
                "prompt_ids": prompt,
                "response_ids": [10 + n, 11 + n],
                "messages": convo[:at],
                "response_text": reply["content"],
                "is_last": last,
            }
            if reply.get("tool_calls"):
                step["metadata"] = {"tool_calls": reply["tool_calls"]}
            if last:
                step["reward"] = reward
            out.append(step)
            prompt = [*prompt, 10 + n, 11 + n, 7]
    return out
