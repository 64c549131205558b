"""What a trainer receives, read back from every output as plain rows, and compared with what
the sources sent (tests/test_fidelity_matrix.py).

Each reader turns one output (a pull in one format, a snapshot file, collate_steps' tensors)
into ``Delivered``: one row per step, keyed by (trajectory_uid, step_index), holding the
fields that output carries, a field it should carry but does not as ``MISSING``. Layout
facts of an output (padding, where its reward token sits, how its tree indexes point) are
checked where they are read, as a ``layout`` field expected to be "ok".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tests.fidelity.doors import OTHERS_SCOPE, SOURCE, Rollout, Scenario


class _Sentinel:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


MISSING = _Sentinel("<missing>")  # the output does not carry the field
UNSPECIFIED = _Sentinel("<unspecified>")  # the contract does not say: not compared
OK = "ok"

Key = tuple[str, int]
# The fields compared, in report order; every output carries some of them.
IDENTITY = ("trajectory_uid", "step_index", "prompt_group_uid", "policy_version")
TOKENS = ("prompt_ids", "response_ids", "rollout_logprobs")
REWARD = ("reward", "reward_scope", "reward_source")
# The two kinds apart (pool/services/effective_reward.py), served as stored whatever the
# assignment.
KINDS = ("outcome_reward", "process_reward")
ALL_FIELDS = (*IDENTITY, *TOKENS, *REWARD, *KINDS)
# The discount of the discounted_return dataset (tests/test_fidelity_matrix.py ASSIGNMENTS).
GAMMA = 0.5


@dataclass
class Delivered:
    rows: dict[Key, dict[str, Any]] = field(default_factory=dict)
    fields: tuple[str, ...] = ALL_FIELDS
    problems: list[str] = field(default_factory=list)  # not tied to a row
    float32: bool = False  # collate_steps: compare floats as float32


# --- expected ---------------------------------------------------------------------------------
def expected_rows(sc: Scenario, rollouts: list[Rollout], assignment: str) -> dict[Key, dict[str, Any]]:
    """What each step of ``sc`` must be delivered as, under a dataset's reward_assignment."""
    out = {}
    for ro in rollouts:
        n = len(ro.steps)
        for s in ro.steps:
            last = s.step_index == n - 1
            reward, scope, source = effective_reward(sc, ro.r, s.step_index, last)
            if assignment == "last_step" and not last and scope != "step":
                reward, scope, source = 0.0, "none", UNSPECIFIED
            outcome, process = reward_kinds(sc, ro.r, s.step_index, n)
            if assignment == "discounted_return":
                reward, scope = discounted_return(sc, ro.r, s.step_index, n), "return"
            out[(s.trajectory_uid, s.step_index)] = {
                "trajectory_uid": s.trajectory_uid,
                "step_index": s.step_index,
                "prompt_group_uid": s.prompt_group_uid,
                "policy_version": s.policy_version,
                "prompt_ids": list(s.prompt_ids),
                "response_ids": list(s.response_ids),
                "rollout_logprobs": None if s.rollout_logprobs is None else list(s.rollout_logprobs),
                "reward": reward,
                "reward_scope": scope,
                "reward_source": source,
                "outcome_reward": outcome,
                "process_reward": process,
                # padded: the reward on the last response token (0.0 for a null reward)
                "token_level_reward": 0.0 if reward is None else reward,
                "branch": 0,  # every agent here continues its own conversation
                "layout": OK,
            }
    return out


def effective_reward(sc: Scenario, r: int, i: int, last: bool) -> tuple[float, str, Any]:
    """(reward, reward_scope, reward_source) of step ``i`` of rollout ``r`` (each_step): its
    own reward, else its branch's (the last step's own), else its trajectory's."""
    source = SOURCE[sc.reward]
    if sc.reward == "step_each":
        return sc.own_reward(r, i), "step", source
    if last:
        own = sc.reward not in ("trajectory", "human")  # those give the trajectory a reward only
        return sc.reward_of(r), "step" if own else "trajectory", source
    return sc.reward_of(r), OTHERS_SCOPE[sc.reward], source


def reward_kinds(sc: Scenario, r: int, i: int, n: int) -> tuple[float, float | None]:
    """(outcome_reward, process_reward) of step ``i`` of rollout ``r`` (of ``n`` steps, one
    branch): the outcome is the last step's own reward (step_each: its own; the other paths
    that reward the last step: the rollout's reward), else the trajectory's (the rollout's
    reward); only step_each gives the other steps a reward of their own, a process reward."""
    if sc.reward == "step_each":
        return sc.own_reward(r, n - 1), (sc.own_reward(r, i) if i < n - 1 else None)
    return sc.reward_of(r), None


def discounted_return(sc: Scenario, r: int, i: int, n: int) -> float:
    """By hand, with GAMMA = 0.5 and one branch of n = 3 steps: step_each, G2 = own(2),
    G1 = own(1) + 0.5 x G2, G0 = own(0) + 0.5 x G1; every other path has no process reward,
    so G_i = 0.5 ** (2 - i) x the rollout's reward."""
    if sc.reward == "step_each":
        g = 0.0
        for k in range(n - 1, i - 1, -1):
            g = sc.own_reward(r, k) + GAMMA * g
        return g
    return GAMMA ** (n - 1 - i) * sc.reward_of(r)


# --- reading the outputs ------------------------------------------------------------------------
def read_steps(batch: dict[str, Any] | None) -> Delivered:
    """The ``steps`` format (also a snapshot's rows: same field names)."""
    out = Delivered(fields=(*ALL_FIELDS, "branch"))
    if batch is None:
        out.problems.append("the pull answered no batch")
        return out
    for s in batch["steps"]:
        out.rows[(s["trajectory_uid"], s["step_index"])] = {f: s.get(f, MISSING) for f in out.fields}
    return out


def read_rows(rows: list[dict[str, Any]]) -> Delivered:
    """A snapshot's rows (JSONL lines, or Parquet rows through pyarrow or datasets)."""
    out = Delivered()
    for s in rows:
        row = {f: s.get(f, MISSING) for f in out.fields}
        for name in TOKENS:
            if row[name] is not None and row[name] is not MISSING:
                row[name] = list(row[name])
        out.rows[(s["trajectory_uid"], s["step_index"])] = row
    return out


def read_padded(batch: dict[str, Any] | None) -> Delivered:
    """The ``padded`` format: rows rebuilt from the 2-D arrays through attention_mask; the
    reward read from token_level_rewards must sit on the last response token only."""
    out = Delivered(
        fields=(*IDENTITY, *TOKENS, "reward", "reward_scope", *KINDS, "token_level_reward", "layout")
    )
    if batch is None:
        out.problems.append("the pull answered no batch")
        return out
    n = len(batch["uid"])
    prompts = np.asarray(batch["prompts"], dtype=np.int64).reshape(n, -1)
    responses = np.asarray(batch["responses"], dtype=np.int64).reshape(n, -1)
    attention = np.asarray(batch["attention_mask"], dtype=np.int64).reshape(n, -1)
    input_ids = np.asarray(batch["input_ids"], dtype=np.int64).reshape(n, -1)
    logprobs = np.asarray(batch["rollout_logprobs"], dtype=np.float64).reshape(n, -1)
    token_rewards = np.asarray(batch["token_level_rewards"], dtype=np.float64).reshape(n, -1)
    p = prompts.shape[1]
    scopes = batch.get("reward_scope")
    for i in range(n):
        in_prompt = attention[i, :p].astype(bool)
        in_response = attention[i, p:].astype(bool)
        rlen = int(in_response.sum())
        layout = []
        if in_prompt.any() and not in_prompt[int(np.argmax(in_prompt)) :].all():
            layout.append("prompt not left-padded")
        if not in_response[:rlen].all():
            layout.append("response not right-padded")
        if responses[i, rlen:].any() or logprobs[i, rlen:].any():
            layout.append("nonzero response padding")
        if not np.array_equal(input_ids[i], np.concatenate([prompts[i], responses[i]])):
            layout.append("input_ids != prompts | responses")
        nonzero = np.flatnonzero(token_rewards[i])
        if rlen and set(nonzero.tolist()) <= {rlen - 1}:
            token_reward: Any = float(token_rewards[i, rlen - 1])
        elif not rlen and not nonzero.size:
            token_reward = 0.0
        else:
            token_reward = f"nonzero at columns {nonzero.tolist()} of a {rlen}-token response"
        out.rows[(batch["trajectory_uid"][i], batch["step_index"][i])] = {
            "trajectory_uid": batch["trajectory_uid"][i],
            "step_index": batch["step_index"][i],
            "prompt_group_uid": batch["prompt_group_uid"][i],
            "policy_version": batch["policy_version"][i],
            "prompt_ids": prompts[i][in_prompt].tolist(),
            "response_ids": responses[i, :rlen].tolist(),
            "rollout_logprobs": logprobs[i, :rlen].tolist() if batch["has_rollout_logprobs"][i] else None,
            "reward": batch["reward"][i],
            "reward_scope": scopes[i] if scopes is not None else MISSING,
            **{k: batch[k][i] if k in batch else MISSING for k in KINDS},
            "token_level_reward": token_reward,
            "layout": "; ".join(layout) or OK,
        }
    return out


def read_tree(batch: dict[str, Any] | None) -> Delivered:
    """The ``tree`` format: each step's sequence followed from last_index up the parents, its
    response tokens and logprobs through response_offsets / response_index."""
    out = Delivered(fields=(*IDENTITY, *TOKENS, "reward", "reward_scope", *KINDS, "layout"))
    if batch is None:
        out.problems.append("the pull answered no batch")
        return out
    ids = np.asarray(batch["input_ids"], dtype=np.int64)
    parent = np.asarray(batch["parent"], dtype=np.int64)
    offsets = np.asarray(batch["response_offsets"], dtype=np.int64)
    index = np.asarray(batch["response_index"], dtype=np.int64)
    logprobs = np.asarray(batch["rollout_logprobs"], dtype=np.float64)
    scopes = batch.get("reward_scope")
    for i, uid in enumerate(batch["trajectory_uid"]):
        seq: list[int] = []
        k = int(batch["last_index"][i])
        while k != -1 and len(seq) <= len(ids):
            seq.append(int(ids[k]))
            k = int(parent[k])
        seq.reverse()
        plen = int(batch["prompt_lens"][i])
        a, b = int(offsets[i]), int(offsets[i + 1])
        response = seq[plen:]
        layout = []
        if len(seq) != int(batch["lengths"][i]):
            layout.append(f"path of {len(seq)} tokens for length {batch['lengths'][i]}")
        if ids[index[a:b]].tolist() != response:
            layout.append("response_index does not point at the response tokens")
        out.rows[(uid, batch["step_index"][i])] = {
            "trajectory_uid": uid,
            "step_index": batch["step_index"][i],
            "prompt_group_uid": batch["prompt_group_uid"][i],
            "policy_version": batch["policy_version"][i],
            "prompt_ids": seq[:plen],
            "response_ids": response,
            "rollout_logprobs": logprobs[a:b].tolist() if batch["has_rollout_logprobs"][i] else None,
            "reward": batch["reward"][i],
            "reward_scope": scopes[i] if scopes is not None else MISSING,
            **{k: batch[k][i] if k in batch else MISSING for k in KINDS},
            "layout": "; ".join(layout) or OK,
        }
    return out


def read_collated(tensors: dict[str, Any], keys: dict[str, Key]) -> Delivered:
    """claw_client.collate_steps' tensors (``keys``: step uid -> row key, from the batch).
    It carries ids, logprobs (float32, 0 where absent) and rewards (float32, has_reward)."""
    out = Delivered(fields=(*TOKENS, "reward"), float32=True)
    p = tensors["prompts"].shape[1]
    for i, uid in enumerate(tensors["step_uids"]):
        attention = tensors["attention_mask"][i].bool()
        in_response = tensors["response_mask"][i].bool()
        out.rows[keys[uid]] = {
            "prompt_ids": tensors["prompts"][i][attention[:p]].tolist(),
            "response_ids": tensors["responses"][i][in_response].tolist(),
            "rollout_logprobs": tensors["rollout_logprobs"][i][in_response].tolist(),
            "reward": float(tensors["rewards"][i]) if bool(tensors["has_reward"][i]) else None,
        }
    return out


# --- comparing --------------------------------------------------------------------------------
Mismatch = tuple[str, str, str, str]  # (row, field, expected, got)


def compare(
    expected: dict[Key, dict[str, Any]],
    got: Delivered,
    labels: dict[str, str],
    pool_state: dict[Key, str],
) -> list[Mismatch]:
    """Every (row, field) where ``got`` differs from ``expected`` (rows of one scenario),
    rows missing (with what the pool says of them) and rows that should not be there."""
    out: list[Mismatch] = []
    mine = {k for k in got.rows if k[0] in labels}
    for key in sorted(expected.keys() | mine):
        row = f"{labels.get(key[0], key[0])}#{key[1]}"
        if key not in got.rows:
            out.append(
                (row, "<row>", "delivered", f"not delivered ({pool_state.get(key, 'not in the pool')})")
            )
            continue
        if key not in expected:
            out.append((row, "<row>", "absent", "delivered, but the source sent no such step"))
            continue
        want, have = expected[key], got.rows[key]
        for name in got.fields:
            w, h = want.get(name, UNSPECIFIED), have[name]
            if w is UNSPECIFIED:
                continue
            if got.float32:
                w = _float32(name, w, len(want["response_ids"]))
            if w != h:
                out.append((row, name, *_describe(w, h)))
    return out


def _float32(name: str, value: Any, response_len: int) -> Any:
    """An expected value as collate_steps' float32 tensors hold it (no logprobs: zeros)."""
    if name == "rollout_logprobs":
        if value is None:
            return [0.0] * response_len
        return np.asarray(value, dtype=np.float32).astype(float).tolist()
    if name == "reward" and value is not None:
        return float(np.float32(value))
    return value


def _describe(want: Any, got: Any) -> tuple[str, str]:
    """Short, exact texts of two differing values (lists: where they first differ)."""
    if isinstance(want, list) and isinstance(got, list):
        n = next(
            (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got))
        )
        at = f"[{n}]={want[n]!r}" if n < len(want) else "<end>"
        got_at = f"[{n}]={got[n]!r}" if n < len(got) else "<end>"
        return f"{len(want)} items, {at}", f"{len(got)} items, {got_at}"
    return _short(want), _short(got)


def _short(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} items {value[:3]!r}..." if len(value) > 3 else repr(value)
    return repr(value)


def report(sc: Scenario, by_output: dict[str, list[Mismatch]], problems: list[str]) -> list[str]:
    """One line per (row, field, expected, got), naming every output that shows it."""
    grouped: dict[Mismatch, list[str]] = defaultdict(list)
    for output, mismatches in by_output.items():
        for m in mismatches:
            grouped[m].append(output)
    lines = [f"{sc.door} x {sc.reward}: {p}" for p in problems]
    for (row, name, want, got), outputs in sorted(grouped.items()):
        lines.append(
            f"{sc.door} x {sc.reward} [{_outputs(outputs)}] {row} {name}: expected {want}, got {got}"
        )
    return lines


def _outputs(names: list[str]) -> str:
    """``each_step/steps, each_step/replay.steps, ...`` as ``each_step:steps+replay,...``."""
    by_assignment: dict[str, list[str]] = defaultdict(list)
    for name in names:
        assignment, _, label = name.partition("/")
        by_assignment[assignment].append(label)
    parts = []
    for assignment, labels in by_assignment.items():
        shown = []
        for label in labels:
            if label.startswith("replay.") and label[7:] in labels:
                continue
            shown.append(f"{label}+replay" if f"replay.{label}" in labels else label)
        parts.append(f"{assignment}:{','.join(shown)}")
    return " ".join(parts)
