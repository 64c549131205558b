"""The bit flags a step carries for curation: readiness and quality.

Both are small integers on the step row (``Step.readiness``, ``Step.quality_flags``) so a
dataset query filters them with plain comparisons, without joins.

Readiness is stored state, kept up to date by pool/services/readiness.py from the write
pipeline's effects, rewards, completions and a periodic sweep. Policy freshness is NOT a
readiness bit: it is evaluated at query time against the current policy version, so a
version bump rewrites nothing.
"""

from __future__ import annotations

import enum


class Readiness(enum.IntFlag):
    # ids from the client or the upstream (not re-encoded by a local tokenizer)
    TOKENS_EXACT = 1
    # the step's reward is final, or its trajectory has a reward
    REWARD_FINAL = 2
    # the trajectory ended as completed (failed and abandoned ones never are)
    TRAJECTORY_COMPLETE = 4
    # the prompt group has its rollouts (or the trajectory has no group)
    GROUP_COMPLETE = 8


READY = int(
    Readiness.TOKENS_EXACT | Readiness.REWARD_FINAL | Readiness.TRAJECTORY_COMPLETE | Readiness.GROUP_COMPLETE
)
# What "ready" means for a dataset that admits retokenized ids.
READY_ANY_TOKENS = READY & ~int(Readiness.TOKENS_EXACT)
# Every readiness value with a final reward and a completed trajectory (6, 7, 14, 15): what
# any dataset query may ask for, and the condition of the partial index step_ready.
TRAINABLE_VALUES = [
    v
    for v in range(READY + 1)
    if v & (Readiness.REWARD_FINAL | Readiness.TRAJECTORY_COMPLETE)
    == (Readiness.REWARD_FINAL | Readiness.TRAJECTORY_COMPLETE)
]
# The bits a trajectory and its group decide (set together by trajectories_refresh).
TRAJECTORY_BITS = int(Readiness.TRAJECTORY_COMPLETE | Readiness.GROUP_COMPLETE)

# Plain ints (not IntFlag members): ``value & bit`` on an enum costs ~2 us, on an int 30 ns,
# and every step read turns its bits into names.
READINESS_NAMES: dict[str, int] = {
    "tokens_exact": int(Readiness.TOKENS_EXACT),
    "reward_final": int(Readiness.REWARD_FINAL),
    "trajectory_complete": int(Readiness.TRAJECTORY_COMPLETE),
    "group_complete": int(Readiness.GROUP_COMPLETE),
}


class Quality(enum.IntFlag):
    EMPTY = 1  # no response tokens
    TRUNCATED = 2  # finish_reason "length"
    REPETITION = 4  # degenerate repetition (few distinct n-grams)
    DRIFT = 8  # the prompt did not extend the previous step (retokenization drift)
    MISSING_LOGPROBS = 16  # no rollout logprobs (importance sampling impossible)
    TOO_LONG = 32  # response longer than CLAW_QUALITY_MAX_RESPONSE_TOKENS
    # Group flags, set when the group's rewards are final (pool/services/readiness.py):
    DUPLICATE = 64  # another rollout of the group gave exactly this response
    ZERO_VARIANCE = 128  # every rollout of the group has the same reward: no GRPO signal
    # Set by a trainer's verdict (curation/services/verdicts.py): the KL between the step's
    # rollout and training logprobs went over its dataset's serving.policy_mismatch_kl.
    POLICY_MISMATCH = 256


QUALITY_NAMES: dict[str, int] = {
    name: int(q)
    for name, q in (
        ("empty", Quality.EMPTY),
        ("truncated", Quality.TRUNCATED),
        ("repetition", Quality.REPETITION),
        ("drift", Quality.DRIFT),
        ("missing_logprobs", Quality.MISSING_LOGPROBS),
        ("too_long", Quality.TOO_LONG),
        ("duplicate", Quality.DUPLICATE),
        ("zero_variance", Quality.ZERO_VARIANCE),
        ("policy_mismatch", Quality.POLICY_MISMATCH),
    )
}
GROUP_QUALITY = int(Quality.DUPLICATE | Quality.ZERO_VARIANCE)


def names(value: int, table: dict[str, int]) -> list[str]:
    """The names of the bits set in ``value``, in the table's order."""
    return [name for name, bit in table.items() if value & bit]


def readiness_text(value: int) -> str:
    """ "ready", or the readiness conditions a step still misses (for people: the admin)."""
    if value == READY:
        return "ready"
    return "missing " + ", ".join(names(READY & ~value, READINESS_NAMES))


def quality_text(value: int) -> str:
    """The quality flags set, comma-separated ("" for a clean step)."""
    return ", ".join(names(value, QUALITY_NAMES))
