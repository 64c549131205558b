"""Reads of what changed: two versions of a dataset, or two snapshots.

* Two dataset versions: the steps each admits now (selectors.specs.dataset_admitted, as a
  snapshot freezes them), compared by step: ``added`` (admitted by ``to``, not ``from``),
  ``removed``, ``kept``, and ``masked_changed`` (admitted by both, served masked by one).
  Both are evaluated on today's pool, so nothing else can differ between them.
* Two snapshots: their frozen contents, read back from their Parquet files (uid, reward,
  quality flags, label, tags, feedback), compared by step uid: ``added``, ``removed``,
  ``kept``, and, among the kept, ``changed``: the steps whose ``reward``, ``quality_flags``
  or review (``label``, ``tags``, ``feedback``) differ, each with what changed.

Counts of every side, and one side listed, keyset-paged (``after``: the last key of the
previous page: a step id for dataset versions, a step uid for snapshots). Both compute the
whole difference per request (two admitted sets, or two files' few columns): O(steps), in
memory, no write.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
from django.core.files.storage import default_storage

from pool.models import Step
from pool.tenancy import Sources

from ..models import DatasetVersion, Snapshot
from ..specs import spec_parse
from .specs import dataset_admitted

VERSION_SIDES = ("added", "removed", "kept", "masked_changed")
SNAPSHOT_SIDES = ("added", "removed", "kept", "changed")
# What a snapshot diff compares, by group of columns: "review" is an operator's.
COMPARED = {
    "reward": ("reward",),
    "quality_flags": ("quality_flags",),
    "review": ("label", "tags", "feedback"),
}
_COLUMNS = ["uid", *(c for cols in COMPARED.values() for c in cols)]


@dataclass(frozen=True, slots=True)
class Diff:
    counts: dict[str, int]
    results: list[Any]
    last: Any  # the page's last key (None when empty)


def versions_diff(
    a: DatasetVersion, b: DatasetVersion, *, sources: Sources, side: str, after: int | None, limit: int
) -> Diff:
    """How version ``b`` of a dataset differs from version ``a`` (see the module), as
    ``sources`` may read it (their steps only; None: all); one side listed by step id."""
    old = dataset_admitted(spec_parse(a.spec), sources=sources)
    new = dataset_admitted(spec_parse(b.spec), sources=sources)
    sides = {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "kept": sorted(old.keys() & new.keys()),
    }
    sides["masked_changed"] = [i for i in sides["kept"] if old[i] != new[i]]
    ids = sides[side]
    page = ids[bisect.bisect_right(ids, after) :] if after is not None else ids
    page = page[:limit]
    uids = dict(Step.objects.filter(id__in=page).values_list("id", "uid"))
    results = [
        {"uid": uids.get(i), "masked": {"from": old.get(i), "to": new.get(i)}} for i in page if i in uids
    ]
    return Diff({k: len(v) for k, v in sides.items()}, results, page[-1] if page else None)


def snapshots_diff(a: Snapshot, b: Snapshot, *, side: str, after: str | None, limit: int) -> Diff:
    """How snapshot ``b``'s content differs from snapshot ``a``'s (see the module); both
    done. One side listed by uid: added and removed steps as their uid, kept ones as their
    uid, changed ones with ``changed`` (the groups that differ) and each differing column's
    (from, to)."""
    old, new = _content(a), _content(b)
    sides: dict[str, list[str]] = {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "kept": sorted(old.keys() & new.keys()),
    }
    changes = {uid: _changes(old[uid], new[uid]) for uid in sides["kept"]}
    sides["changed"] = [uid for uid in sides["kept"] if changes[uid]]
    counts = {k: len(v) for k, v in sides.items()}
    for group in COMPARED:
        counts[f"{group}_changed"] = sum(1 for uid in sides["changed"] if group in changes[uid])
    uids = sides[side]
    page = uids[bisect.bisect_right(uids, after) :] if after is not None else uids
    page = page[:limit]
    if side == "changed":
        results: list[Any] = [
            {
                "uid": uid,
                "changed": sorted(changes[uid]),
                **{col: [old[uid][col], new[uid][col]] for g in changes[uid] for col in COMPARED[g]},
            }
            for uid in page
        ]
    else:
        results = [{"uid": uid} for uid in page]
    return Diff(counts, results, page[-1] if page else None)


def _content(snap: Snapshot) -> dict[str, dict[str, Any]]:
    """A done snapshot's compared columns by step uid, from its Parquet file."""
    with default_storage.open(snap.files["parquet"], "rb") as fh:
        table = pq.read_table(fh, columns=_COLUMNS)
    cols = table.to_pydict()
    return {uid: {c: cols[c][i] for c in _COLUMNS[1:]} for i, uid in enumerate(cols["uid"])}


def _changes(old: dict[str, Any], new: dict[str, Any]) -> set[str]:
    return {g for g, cols in COMPARED.items() if any(not _same(old[c], new[c]) for c in cols)}


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y
