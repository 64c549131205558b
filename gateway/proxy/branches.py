"""Branches of a trajectory: which earlier call a proxied chat call continues.

An agent's calls usually form one conversation: each call's messages are the previous
call's messages plus its reply plus what came next. Two things break that, and they differ:

* the messages extend an earlier call's conversation but the tokens do not extend its ids:
  template drift (a chat template that is not append-only, a reformatted tool call). The step
  keeps ``drift`` and ``drift_offset`` (gateway/proxy/recording.py);
* the messages do not extend any earlier call's conversation: the agent compacted its
  context, started a sub-agent, or rewrote its history. That is not drift but a new branch:
  the step gets the next ``branch`` number and ``parent_step`` = the step whose conversation
  it shares the longest message prefix with (ties: the most recent). Each branch is then a
  prefix-consistent sequence of its own, which the prefix-tree merge and the formats serve as
  any sequence.

A call that extends some branch's latest call continues that branch (its ``parent_step`` is
that call's step), whichever branch was used last: a main agent that resumes after its
sub-agent returns to its own branch, and its tokens are checked against that branch.

Cost on the hot path: one 8-byte hash per message (blake2b of its canonical JSON, chained
so that hash i covers messages 0..i), and a comparison of the latest call of each branch
with the new call: a hash equality (extends?) or a binary search (longest common prefix).
The branches' latest calls are kept per process (``known``) and trusted only when they end
where the trajectory's previous append ends; otherwise they are read back from the pool
(two queries). Calls without messages (text completions, white-box steps) take no part:
a trajectory whose latest calls have no messages keeps the token-only rule.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from cachetools import LRUCache
from django.db.models import Max

from pool import tokens
from pool.models import Step

HASH_BYTES = 8


@dataclass(slots=True)
class Tip:
    """A step of the latest call of one branch, with its conversation's hash chain
    (messages + reply)."""

    step_id: int
    branch: int
    chain: list[bytes]


@dataclass(slots=True)
class Branches:
    """A trajectory's branches as of step index ``end`` (exclusive)."""

    end: int
    tips: list[Tip] = field(default_factory=list)  # most recent call first
    next_branch: int = 1


@dataclass(slots=True)
class Decision:
    branch: int
    parent: Tip | None
    continued: bool  # extends ``parent``'s conversation (else: a new branch, or the first call)
    common: int = 0  # messages shared with ``parent``


# --- hashing ------------------------------------------------------------------------------------
def chain(messages: Sequence[Any], start: bytes = b"") -> list[bytes]:
    """Prefix hashes of ``messages``: element i covers messages 0..i."""
    out = []
    h = start
    for m in messages:
        h = hashlib.blake2b(h + _canonical(m), digest_size=HASH_BYTES).digest()
        out.append(h)
    return out


def _canonical(message: Any) -> bytes:
    """What a message means, not how a client spelled it: role, text, tool calls (id, name,
    arguments as parsed JSON), tool_call_id and name. SDKs echo replies back with extra null
    fields, other key orders and reformatted arguments; those are the same message (and if
    the tokens then differ, that is drift, which the tokens show)."""
    if not isinstance(message, dict):
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
    out: dict[str, Any] = {"role": message.get("role"), "content": _text(message.get("content"))}
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call(c) for c in calls]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return orjson.dumps(out, option=orjson.OPT_SORT_KEYS)


def _text(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(p.get("text") or "" for p in content)
    return content


def _call(call: Any) -> Any:
    if not isinstance(call, dict):
        return call
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            pass
    return {"id": call.get("id"), "name": fn.get("name"), "arguments": args}


def reply_message(text: str | None, meta: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a recorded reply (its text and tool calls)."""
    return {"role": "assistant", "content": text, "tool_calls": meta.get("tool_calls")}


# --- deciding -----------------------------------------------------------------------------------
def decide(state: Branches, messages_chain: list[bytes]) -> Decision:
    """The branch of a call whose messages hash to ``messages_chain`` (see the module
    docstring)."""
    if not state.tips:
        return Decision(branch=0, parent=None, continued=False)
    n = len(messages_chain)
    for tip in state.tips:
        k = len(tip.chain)
        if k <= n and messages_chain[k - 1] == tip.chain[-1]:
            return Decision(branch=tip.branch, parent=tip, continued=True, common=k)
    best, best_common = state.tips[0], -1
    for tip in state.tips:
        common = _common_prefix(tip.chain, messages_chain)
        if common > best_common:
            best, best_common = tip, common
    return Decision(branch=state.next_branch, parent=best, continued=False, common=best_common)


def _common_prefix(a: list[bytes], b: list[bytes]) -> int:
    """Number of leading messages two chains share (prefix hashes: binary search)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def after(state: Branches, end: int, written: list[Tip]) -> Branches:
    """``state`` once a call's steps ``written`` (one branch) are stored, ending at ``end``."""
    branch = written[0].branch
    tips = written + [t for t in state.tips if t.branch != branch]
    return Branches(end=end, tips=tips, next_branch=max(state.next_branch, branch + 1))


# --- per-process state, the pool as the truth ------------------------------------------------------
class Known:
    """LRU of each trajectory's Branches (bounded by trajectories). Thread-safe."""

    def __init__(self, max_trajectories: int):
        self.max = max_trajectories
        self._data: LRUCache[str, Branches] = LRUCache(maxsize=max_trajectories)
        self._lock = threading.Lock()

    def get(self, trajectory_uid: str, end: int) -> Branches | None:
        if trajectory_uid not in self._data:  # a new trajectory, most calls' case: no lock
            return None
        with self._lock:
            hit = self._data.get(trajectory_uid)  # a hit is the most recent
            return hit if hit is not None and hit.end == end else None

    def put(self, trajectory_uid: str, state: Branches) -> None:
        with self._lock:
            self._data[trajectory_uid] = state

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


# 100k trajectories of a few branches, a few hundred messages each: ~ hundreds of MB at most.
known = Known(max_trajectories=100_000)


def load(trajectory_uid: str, end: int) -> Branches:
    """The trajectory's branches as stored, before step index ``end``: the latest call of
    each branch (two queries, served by step_traj_index_uniq)."""
    if end <= 0:
        return Branches(end=0)
    steps = Step.objects.filter(trajectory__uid=trajectory_uid, step_index__lt=end)
    latest = dict(steps.values_list("branch").annotate(last=Max("step_index")))
    if not latest:
        return Branches(end=end)
    rows = list(
        steps.filter(step_index__in=list(latest.values()))
        .order_by("-step_index")
        .values("id", "branch", "messages", "response_text", "metadata")
    )
    # The latest call of a branch may have had n > 1 choices: its other steps share its
    # prompt (and so its messages) and carry metadata.n; include them as tips too.
    tips = []
    for r in rows:
        if r["messages"] is None:
            continue
        convo = [*r["messages"], reply_message(r["response_text"], r["metadata"] or {})]
        tips.append(Tip(step_id=r["id"], branch=r["branch"], chain=chain(convo)))
        n = (r["metadata"] or {}).get("n")
        if isinstance(n, int) and n > 1:
            siblings = steps.filter(
                branch=r["branch"],
                step_index__gte=latest[r["branch"]] - n + 1,
                step_index__lt=latest[r["branch"]],
            ).values("id", "messages", "response_text", "metadata")
            for s in siblings:
                if s["messages"] == r["messages"]:
                    sib = [*s["messages"], reply_message(s["response_text"], s["metadata"] or {})]
                    tips.append(Tip(step_id=s["id"], branch=r["branch"], chain=chain(sib)))
    return Branches(end=end, tips=tips, next_branch=max(latest) + 1)


def tip_ids(step_id: int) -> Any:
    """The full token ids of a stored step (for drift against a branch that is not the
    previous call)."""
    return tokens.bytes_to_ids(tokens.load_sequences([step_id])[step_id])
