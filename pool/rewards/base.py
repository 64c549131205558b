"""The reward function contract: what a function receives and returns, and how it says
whether it scores one sample or a group."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True)
class RewardSample:
    """One response to score. ``response_text`` is the text the gateway saw (or decoded);
    ``ground_truth`` comes from the sample's reward_model/ground_truth fields."""

    data_source: str
    response_text: str
    ground_truth: Any = None
    prompt_text: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    key: str = ""  # a trajectory uid, or "" for a sample scored on its own


@dataclass(slots=True)
class RewardResult:
    score: float
    info: dict[str, Any] = field(default_factory=dict)


class RewardError(Exception):
    """A reward that cannot be computed (bad ground truth, judge answer unusable...); its
    message is recorded as the failure."""


def per_sample(*, source: str = "rule") -> Callable[[F], F]:
    """Mark a one-sample function; ``source`` is the RewardEvent source (rule or model)."""

    def mark(fn: F) -> F:
        fn.reward_source = source  # type: ignore[attr-defined]
        fn.reward_group = False  # type: ignore[attr-defined]
        return fn

    return mark


def rule(fn: F) -> F:
    """A one-sample rule reward (RewardEvent source "rule")."""
    return per_sample(source="rule")(fn)


def group(*, source: str = "model") -> Callable[[F], F]:
    """Mark a function that scores a whole group at once (``fn(samples) -> scores``)."""

    def mark(fn: F) -> F:
        fn.reward_source = source  # type: ignore[attr-defined]
        fn.reward_group = True  # type: ignore[attr-defined]
        return fn

    return mark


def is_group(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, "reward_group", False))


def source_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "reward_source", "rule")


def as_result(value: Any) -> RewardResult:
    """A function's return value as a RewardResult: a finite number, or a RewardResult."""
    if isinstance(value, RewardResult):
        result = value
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise RewardError(f"the reward function returned {type(value).__name__}, not a number")
    else:
        result = RewardResult(float(value))
    if result.score != result.score or result.score in (float("inf"), float("-inf")):
        raise RewardError("the reward function returned a non-finite score")
    from django.conf import settings  # the reward bound every door applies (rules.check_reward)

    limit = settings.CLAW_REWARD_ABS_MAX
    if abs(result.score) > limit:
        raise RewardError(
            f"the reward function returned {result.score:g}, beyond +-{limit:g} (CLAW_REWARD_ABS_MAX)"
        )
    result.score = float(result.score)
    return result
