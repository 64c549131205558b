"""Plan: from validated steps to the rows the backend writes.

For each step: its full id array and hashes (``pack``), the parent it is stored against
(the candidate with the longest common prefix, see pool/tokens.py), and its Step row
(``step_row``). Steps whose parent is in the same write form a later wave, so every parent
has its id before its children's rows are built. Pure Python and numpy: no queries.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from .. import quality, tokens
from ..flags import Readiness
from ..models import Step
from ..sql import new_instance
from .contract import CONTENT_FIELDS, TOKEN_ARRAYS, StepIn

EXACT_TOKEN_SOURCES = frozenset({Step.TokenSource.CLIENT, Step.TokenSource.UPSTREAM})
# Plain ints: an IntFlag operator costs microseconds (most of step_row's own time, pyinstrument).
_TOKENS_EXACT, _REWARD_FINAL = int(Readiness.TOKENS_EXACT), int(Readiness.REWARD_FINAL)


@dataclass(slots=True)
class Packed:
    """What the pipeline derives from a step once: its full id array and the two hashes."""

    full: np.ndarray
    seq_hash: bytes
    content_hash: bytes


def pack(s: StepIn) -> Packed:
    full = s.full_ids()
    seq_hash = tokens.seq_hash(tokens.ids_to_bytes(full))
    return Packed(full=full, seq_hash=seq_hash, content_hash=content_hash(s, seq_hash))


def content_hash(s: StepIn, seq_hash: bytes) -> bytes:
    """Fingerprint of everything submitted (contract.CONTENT_FIELDS), for idempotency: the
    tokens enter through ``seq_hash``, so they are hashed once."""
    h = hashlib.blake2b(digest_size=16)
    head = list(_content(s))
    for i in _ARRAY_AT:
        head[i] = len(head[i])
    h.update(orjson.dumps(head, option=orjson.OPT_SORT_KEYS))
    h.update(seq_hash)
    if s.rollout_logprobs is not None:
        h.update(b"lp")
        h.update(np.ascontiguousarray(s.rollout_logprobs, dtype=tokens.LOGPROB_DTYPE).tobytes())
    if s.images:  # by content and place (pool/ingest/media.py); absent: the old fingerprint
        h.update(b"img")
        h.update(orjson.dumps([im.key() for im in s.images]))
    # Per-token fields, each only when given (absent: the old fingerprint).
    if s.token_rewards is not None:
        h.update(b"tr")
        h.update(np.ascontiguousarray(s.token_rewards, dtype=tokens.LOGPROB_DTYPE).tobytes())
    if s.token_policy_versions is not None:
        h.update(b"tv")
        h.update(tokens.runs_to_bytes(s.token_policy_versions))
    return h.digest()


_content = operator.attrgetter(*CONTENT_FIELDS)
_ARRAY_AT = [i for i, f in enumerate(CONTENT_FIELDS) if f in TOKEN_ARRAYS]


@dataclass(slots=True)
class Stored:
    """A stored step that new steps may be encoded against."""

    id: int
    depth: int
    full: np.ndarray


# A parent candidate: a stored step, or the index of another step of the same write.
Candidate = Stored | int


@dataclass(slots=True)
class Planned:
    step: StepIn
    packed: Packed
    parent: Candidate | None  # the chosen parent (None: stored whole)


def choose_parents(
    steps: Sequence[StepIn], packed: Sequence[Packed], candidates: Sequence[Sequence[Candidate]]
) -> list[Planned]:
    """The candidate sharing the longest prefix with each step, if it shares at least
    MIN_SHARED_TOKENS (a shorter link costs more on every read than it saves)."""
    out = []
    for i, (s, p) in enumerate(zip(steps, packed, strict=True)):
        best: Candidate | None = None
        best_len = -1
        for c in candidates[i]:
            other = packed[c].full if isinstance(c, int) else c.full
            n = tokens.common_prefix_len(p.full, other)
            if n > best_len:
                best, best_len = c, n
        out.append(Planned(s, p, best if best_len >= tokens.MIN_SHARED_TOKENS else None))
    return out


def waves(planned: Sequence[Planned]) -> list[list[int]]:
    """Indexes of ``planned`` grouped so that in-write parents come in an earlier wave. A
    write of independent steps (or of one call's choices) is one wave: one insert."""
    wave: dict[int, int] = {}

    def depth(i: int) -> int:
        if i not in wave:
            p = planned[i].parent
            wave[i] = depth(p) + 1 if isinstance(p, int) else 0
        return wave[i]

    for i in range(len(planned)):
        depth(i)
    out: list[list[int]] = [[] for _ in range(max(wave.values(), default=-1) + 1)]
    for i in range(len(planned)):
        out[wave[i]].append(i)
    return out


# (the step ends its branch, the branch's outcome reward), where a write knows them.
Outcome = tuple[bool, float | None] | None


def step_row(
    p: Planned,
    *,
    trajectory_id: int | None,
    parent: tuple[int, np.ndarray, int] | None,
    source_id: int | None,
    readiness: int = 0,
    outcome: Outcome = None,
) -> Step:
    """The unsaved Step row of a planned step, its tokens encoded against ``parent`` (id,
    full ids, depth) when given. Every write path builds its rows here. ``readiness``: the
    bits its trajectory and group already decide (a batch that completes the trajectory),
    so the row is written once with them rather than rewritten by the effects.
    ``outcome``: (this step ends its branch, the branch's outcome) where the write knows
    them (a batch that creates and ends the trajectory); otherwise an own reward is a
    process reward until the effects learn more (pool/services/effective_reward.py)."""
    s, packed = p.step, p.packed
    enc = tokens.encode_against(packed.full, parent[1] if parent else None, parent[2] if parent else 0)
    response = packed.full[len(s.prompt_ids) :]
    # The readiness bits the step decides itself; its trajectory's and group's bits are set
    # by the effects (pool/services/readiness.py) once they hold.
    ends_branch, outcome_reward = outcome if outcome is not None else (False, None)
    # An own reward given with the step is final: the step is reward-final once its branch's
    # outcome is known.
    readiness = int(readiness) | (_TOKENS_EXACT if s.token_source in EXACT_TOKEN_SOURCES else 0)
    if s.reward is not None and outcome_reward is not None:
        readiness |= _REWARD_FINAL
    source = (s.reward_source or Step.RewardSource.ENV) if s.reward is not None else None
    return new_instance(  # type: ignore[return-value]
        Step,
        dict(
            uid=s.uid,
            trajectory_id=trajectory_id,
            step_index=s.step_index,
            seq_parent_id=parent[0] if parent and enc.shared else None,
            seq_shared=enc.shared,
            seq_delta=enc.delta,
            seq_len=len(packed.full),
            prompt_len=len(s.prompt_ids),
            seq_depth=enc.depth,
            seq_hash=packed.seq_hash,
            rollout_logprobs=(
                np.ascontiguousarray(s.rollout_logprobs, dtype=tokens.LOGPROB_DTYPE).tobytes()
                if s.rollout_logprobs is not None
                else None
            ),
            token_rewards=(
                np.ascontiguousarray(s.token_rewards, dtype=tokens.LOGPROB_DTYPE).tobytes()
                if s.token_rewards is not None
                else None
            ),
            token_versions=(
                tokens.runs_to_bytes(s.token_policy_versions) if s.token_policy_versions is not None else None
            ),
            content_hash=packed.content_hash,
            reward=s.reward,
            reward_status=Step.RewardStatus.FINAL if s.reward is not None else Step.RewardStatus.PENDING,
            reward_source=source,
            # Its own reward is its effective one; a step without one gets its branch's or its
            # trajectory's from the effects (pool/services/effective_reward.py).
            effective_reward=s.reward,
            effective_reward_source=source,
            reward_scope=Step.RewardScope.STEP if s.reward is not None else None,
            outcome_reward=outcome_reward if s.reward is not None else None,
            process_reward=s.reward if not ends_branch else None,
            policy_version_id=s.policy_version,
            is_last=s.is_last,
            finish_reason=s.finish_reason,
            token_source=s.token_source,
            drift=s.drift,
            drift_offset=s.drift_offset,
            branch=s.branch,
            parent_step_id=s.parent_step_id,
            readiness=readiness,
            quality_flags=quality.step_quality(
                response,
                finish_reason=s.finish_reason,
                drift=s.drift,
                has_logprobs=s.rollout_logprobs is not None,
            ),
            response_hash=quality.response_hash(response),
            messages=s.messages,
            response_text=s.response_text,
            metadata=s.metadata,
            source_id=source_id,
        ),
    )


def build_rows(
    planned: Sequence[Planned],
    *,
    trajectory_id_of: Callable[[StepIn], int | None],
    source_id: int | None,
    insert: Callable[[list[Step]], None],
    readiness_of: Callable[[StepIn], int] = lambda s: 0,
    outcome_of: Callable[[StepIn], Outcome] = lambda s: None,
) -> list[Step]:
    """Build and insert the rows wave by wave (a parent's id is known before its children's
    rows are built); returns the rows in write order. ``readiness_of`` and ``outcome_of``:
    what the write knows of each step (step_row)."""
    built: dict[int, Step] = {}
    for wave in waves(planned):
        rows = []
        for i in wave:
            p = planned[i]
            parent: tuple[int, np.ndarray, int] | None = None
            if isinstance(p.parent, int):
                row = built[p.parent]
                parent = (row.id, planned[p.parent].packed.full, row.seq_depth)
            elif p.parent is not None:
                parent = (p.parent.id, p.parent.full, p.parent.depth)
            built[i] = step_row(
                p,
                trajectory_id=trajectory_id_of(p.step),
                parent=parent,
                source_id=source_id,
                readiness=readiness_of(p.step),
                outcome=outcome_of(p.step),
            )
            rows.append(built[i])
        insert(rows)
    return [built[i] for i in range(len(planned))]
