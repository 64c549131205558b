"""TRL datasets from a ``steps`` batch: conversational SFT rows and preference pairs.

Pure Python over the ``steps`` format (no TRL, torch or Django import; ``checkpoint_callback``
imports transformers when called): the rows are what
``datasets.Dataset.from_list`` takes and TRL's ``SFTTrainer`` / ``DPOTrainer`` train on::

    with claw.pull("grpo", consumer="sft", batch_size=64) as batch:
        sft = Dataset.from_list(to_sft_rows(batch))                 # {"messages": [...]}
        dpo = Dataset.from_list(to_dpo_pairs(batch, margin=0.5))    # {"prompt", "chosen", "rejected"}

A **rollout** is one branch of a trajectory (``trajectory_uid``, ``branch``; a trajectory
without branches is one rollout). Its conversation is its final step's (highest
``step_index``) chat ``messages`` followed by that step's reply: an assistant message with the
step's ``response_text`` as ``content`` and, when the step's ``metadata`` has them (the
gateway records them there), its OpenAI-style ``tool_calls``. Earlier tool calls and ``tool``
messages are part of the final step's ``messages`` as the agent sent them. Its reward is the
final step's effective reward as served. Rollouts whose final step has no ``messages``, a
null reward, or ``mask`` true are left out. Rollouts are compared within their prompt group
(``prompt_group_uid``; a trajectory without a group is a group of its own).

Lineage: train within a run (``ClawClient.open_run``) and publish each model as a
checkpoint of it once its leases are acked: after the ``with`` block of a pull
(``run.set_policy_version(v)``), or, for leases acked before training, at each save with
``checkpoint_callback(run, start=v)`` among the trainer's callbacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Message = dict[str, Any]


def checkpoint_callback(run: Any, *, start: int = 0, current: bool = False) -> Any:
    """A ``transformers.TrainerCallback`` (TRL's trainers take it in ``callbacks=[...]``)
    that publishes ``start + global_step`` as a checkpoint of ``run`` (a ``claw_client.Run``)
    at each save and at the end of training, once per step: each checkpoint holds the leases
    acked since the previous one, so ack the pulls a dataset was built from before training.
    ``current``: also make it the policy's current version (default: no, an SFT or DPO model
    is not what agents roll out with). Imports transformers when called."""
    from transformers import TrainerCallback

    class ClawCheckpoint(TrainerCallback):
        def __init__(self) -> None:
            self.published: list[int] = []

        def _publish(self, state: Any) -> None:
            version = start + int(state.global_step)
            if not self.published or self.published[-1] != version:
                run.set_policy_version(version, current=current)
                self.published.append(version)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._publish(state)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self._publish(state)

    return ClawCheckpoint()


def conversation(step: dict[str, Any]) -> list[Message]:
    """The full conversation of a step: its ``messages`` then its reply (see the module)."""
    reply: Message = {"role": "assistant", "content": step.get("response_text") or ""}
    calls = (step.get("metadata") or {}).get("tool_calls")
    if calls:
        reply["tool_calls"] = calls
    return [*(step.get("messages") or []), reply]


def rollouts(batch: Any) -> list[dict[str, Any]]:
    """The batch's usable rollouts in batch order (of their final steps): each
    ``{"group", "trajectory_uid", "branch", "reward", "outcome_reward", "process_rewards",
    "messages"}``."""
    last: dict[tuple[str, int], dict[str, Any]] = {}
    process: dict[tuple[str, int], dict[int, float]] = {}
    for s in _steps_of(batch):
        key = (s["trajectory_uid"], s.get("branch") or 0)
        if key not in last or s["step_index"] >= last[key]["step_index"]:
            last[key] = s
        if s.get("process_reward") is not None:
            process.setdefault(key, {})[s["step_index"]] = float(s["process_reward"])
    out = []
    for (traj, branch), s in last.items():
        if s.get("messages") is None or s.get("reward") is None or s.get("mask"):
            continue
        out.append(
            {
                "group": s.get("prompt_group_uid") or f"trajectory:{traj}",
                "trajectory_uid": traj,
                "branch": branch,
                "reward": float(s["reward"]),
                # The two kinds apart: the branch's outcome, and the process rewards of
                # its steps in the batch (step_index -> reward).
                "outcome_reward": s.get("outcome_reward"),
                "process_rewards": process.get((traj, branch), {}),
                "messages": conversation(s),
            }
        )
    return out


def to_sft_rows(
    batch: Any, *, min_reward: float | None = None, rewards: bool = False
) -> list[dict[str, Any]]:
    """TRL conversational SFT rows ``{"messages": [...]}``: the best rollout of each group
    (highest reward, the first in batch order on a tie), or, with ``min_reward``, every
    rollout whose reward is at least ``min_reward``. Groups in order of first appearance.
    ``rewards``: each row also says why it was chosen, ``reward``, ``outcome_reward`` and
    ``process_rewards`` (``rollouts``)."""
    if min_reward is not None:
        chosen = [r for r in rollouts(batch) if r["reward"] >= min_reward]
    else:
        chosen = [max(g, key=lambda r: r["reward"]) for g in _groups(batch)]
    keys = ("messages", "reward", "outcome_reward", "process_rewards") if rewards else ("messages",)
    return [{k: r[k] for k in keys} for r in chosen]


def to_dpo_pairs(batch: Any, *, margin: float = 0.0) -> list[dict[str, Any]]:
    """TRL conversational preference pairs ``{"prompt", "chosen", "rejected"}``: in each group,
    the best rollout (as in ``to_sft_rows``) chosen against every other rollout whose reward
    is lower by at least ``margin`` (and lower at all), in batch order. ``prompt`` is the
    messages both conversations share from the start; ``chosen`` and ``rejected`` are the
    rest of each (the assistant's turns, with any tool messages between them)."""
    if margin < 0:
        raise ValueError("margin must be >= 0")
    out = []
    for group in _groups(batch):
        best = max(group, key=lambda r: r["reward"])
        for r in group:
            if r is best or best["reward"] - r["reward"] < margin or r["reward"] >= best["reward"]:
                continue
            n = _common_prefix(best["messages"], r["messages"])
            out.append(
                {
                    "prompt": best["messages"][:n],
                    "chosen": best["messages"][n:],
                    "rejected": r["messages"][n:],
                }
            )
    return out


def _groups(batch: Any) -> list[list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rollouts(batch):
        groups.setdefault(r["group"], []).append(r)
    return list(groups.values())


def _common_prefix(a: list[Message], b: list[Message]) -> int:
    """How many leading messages ``a`` and ``b`` share, at most all but the last of the
    shorter, so that both sides keep at least their final reply."""
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    return n


def _steps_of(batch: Any) -> Iterable[dict[str, Any]]:
    if hasattr(batch, "batch") and not isinstance(batch, dict):
        batch = batch.batch or {}  # a client Batch: its JSON as served
    if isinstance(batch, dict):
        if "steps" in batch:
            return batch["steps"]
        return (batch.get("batch") or {}).get("steps") or []  # a whole pull answer
    return batch
