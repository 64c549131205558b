"""Claim: step indexes for appended steps (proxied calls), and the tail they follow.

An append takes the next ``n`` indexes of its trajectory. The database is the truth: the
index is reserved by an UPDATE of ``step_count`` under the row lock (general path) or by a
conditional UPDATE fused with the insert (fast path, pool/sql.py).

``recent`` is a per-process hint: each trajectory's latest append (its end index and its
steps' sequences), so the next call of a trajectory needs neither a lookup of the previous
call nor its tokens. A hint is used only when the claim proves it current (its end index is
still the trajectory's step_count, checked in the same statement); a stale hint, left by
another process's write, makes the claim miss and the general path run.

A trajectory ``recent`` does not know is taken to be new (``ABSENT``): the fast path creates
it in the same statement, only if no row has its uid, and with a prompt group creates the
group too, only if the group is new or has no anchor yet and the writer may join it. An
existing one makes the statement write nothing and the general path run. ``anchors`` holds
the groups this process knows to have an anchor (a first step), with the anchor's sequence
once read: a new rollout's first step is then stored against it in the one statement, which
checks that it is still the group's anchor; a group whose anchor was not read yet sends the
rollout to the general path, which reads it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from cachetools import LRUCache

from .. import tokens
from ..models import Step
from .plan import Stored


@dataclass(slots=True)
class Tail:
    """The latest append of a trajectory before this one: indexes [start, end)."""

    end: int
    steps: list[Stored]


EMPTY = Tail(end=0, steps=[])
# The fast path's hint for a trajectory it takes to be new (module docstring): the statement
# creates it. Told apart by identity: a remembered tail may end at 0 too (a registered
# trajectory without steps), and is claimed.
ABSENT = Tail(end=0, steps=[])


def tail_load(trajectory_id: int, start: int, end: int) -> Tail:
    """The stored steps [start, end) of a trajectory with their full sequences (two
    queries: the rows, then their delta chains)."""
    if end <= 0:
        return EMPTY
    rows = list(
        Step.objects.filter(
            trajectory_id=trajectory_id, step_index__gte=min(start, end - 1), step_index__lt=end
        )
        .order_by("step_index")
        .values_list("id", "seq_depth")
    )
    full = tokens.load_sequences(sid for sid, _ in rows)
    return Tail(end=end, steps=[Stored(sid, depth, tokens.bytes_to_ids(full[sid])) for sid, depth in rows])


class RecentAppends:
    """LRU of each trajectory's latest append, bounded by the number of tokens held
    (cachetools.LRUCache sized by each tail's tokens). Thread-safe (the gateway records
    from a thread pool); the cache itself is not, so every access holds the lock."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._data: LRUCache[str, Tail] = LRUCache(maxsize=max_tokens, getsizeof=_tail_tokens)
        self._lock = threading.Lock()

    def get(self, trajectory_uid: str, end: int) -> Tail | None:
        """The hint for ``trajectory_uid`` if it ends exactly at ``end``."""
        hit = self.latest(trajectory_uid)
        return hit if hit is not None and hit.end == end else None

    def latest(self, trajectory_uid: str) -> Tail | None:
        with self._lock:
            return self._data.get(trajectory_uid)  # a hit becomes the most recent

    def put(self, trajectory_uid: str, tail: Tail) -> None:
        with self._lock:
            self._data.pop(trajectory_uid, None)
            if _tail_tokens(tail) <= self.max_tokens:  # a larger one is not kept (nor raises)
                self._data[trajectory_uid] = tail  # evicts the least recent past max_tokens

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def _tail_tokens(tail: Tail) -> int:
    """A hint's size: its tokens, and at least 1 (a tail without steps is an entry too)."""
    return max(1, sum(len(p.full) for p in tail.steps))


# 16 M tokens = 64 MB of int32: the latest call of thousands of live trajectories.
recent = RecentAppends(max_tokens=16_000_000)


@dataclass(slots=True)
class GroupAnchor:
    """A prompt group this process knows to have an anchor: its id and, once read, its
    anchor step (the parent candidate of its rollouts' first steps), else None."""

    group_id: int
    anchor: Stored | None


class GroupAnchors:
    """LRU of the groups known to have an anchor (module docstring), bounded by the anchor
    tokens held (at least 1 an entry). Thread-safe."""

    def __init__(self, max_tokens: int):
        self._data: LRUCache[str, GroupAnchor] = LRUCache(maxsize=max_tokens, getsizeof=_anchor_tokens)
        self._lock = threading.Lock()

    def get(self, group_uid: str) -> GroupAnchor | None:
        with self._lock:
            return self._data.get(group_uid)

    def put(self, group_uid: str, known: GroupAnchor) -> None:
        with self._lock:
            self._data.pop(group_uid, None)
            if _anchor_tokens(known) <= self._data.maxsize:
                self._data[group_uid] = known

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


def _anchor_tokens(known: GroupAnchor) -> int:
    return max(1, len(known.anchor.full) if known.anchor is not None else 0)


# 4 M tokens = 16 MB of int32: the prompts of thousands of groups in flight.
anchors = GroupAnchors(max_tokens=4_000_000)
