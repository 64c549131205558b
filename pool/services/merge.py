"""Prefix-tree merge results (filled in by the prefix-tree work)."""

from __future__ import annotations


def group_merge_compute(*, group_id: int) -> None:
    """Placeholder until the prefix-tree module lands: does nothing."""
    return None
