"""Which function scores a data source: a RewardFunction row (the admin) for that name, else
settings.CLAW_REWARD_FUNCTIONS. A disabled row switches the name off."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from ..models import RewardFunction
from .base import RewardError


@dataclass(frozen=True, slots=True)
class Resolved:
    name: str  # the data source or dataset it was found under
    path: str
    fn: Callable[..., Any]


def resolve(*names: str | None) -> Resolved | None:
    """The function of the first of ``names`` (data source, then dataset) that names one;
    None if none does. Raises RewardError when the configured path does not import."""
    wanted = [n for n in names if n]
    if not wanted:
        return None
    rows = {r.name: r for r in RewardFunction.objects.filter(name__in=wanted)}
    configured: dict[str, str] = settings.CLAW_REWARD_FUNCTIONS
    for name in wanted:
        row = rows.get(name)
        if row is not None:
            if not row.enabled:
                continue
            path = row.path
        elif name in configured:
            path = configured[name]
        else:
            continue
        return Resolved(name, path, load(path))
    return None


def load(path: str) -> Callable[..., Any]:
    try:
        fn = import_string(path)
    except ImportError as exc:
        raise RewardError(f"reward function {path!r} cannot be imported: {exc}") from None
    if not callable(fn):
        raise RewardError(f"reward function {path!r} is not callable")
    return fn
