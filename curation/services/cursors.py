"""Pull cursors: an oldest-first pull reads its ready queue from where its consumer stands.

A ready queue (ready groups by ``ready_at``, lone completed trajectories by ``completed_at``,
ties by id) is read oldest first, skipping what the consumer has taken (its Delivery rows and
the drops that still hold: services.consume._not_taken). Read from the head, a consumer that
has taken N units pays N index entries and N anti-join probes per pull: a trainer months in
pays for every batch it ever took. A ``PullCursor`` remembers, per consumer, dataset and
queue, a position at or before which every unit is taken; the pull reads after it.

The position is only ever a promise that everything before it is taken, so each event that
gives a unit back moves it back first:

* a nack, an admin's release or an expiry deletes Delivery rows: ``cursors_rewind`` moves
  the cursor to just before the earliest unit given back, and bumps ``epoch``;
* a drop stops holding when the dataset gets a new version or the current policy version
  moves back below the one the position was taken under: the cursor is then not used (the
  pull reads from the head, and writes the position it finds);
* a unit can become ready with a ready time behind the cursor: a transaction in flight
  stamped it before it committed (the cursor stays ``CLAW_PULL_CURSOR_LAG_SECONDS`` behind
  now, and every retention sweep moves each cursor back to two sweep intervals before now,
  ``cursors_rewind_recent``: a commit slower than the lag delays a unit by one sweep at
  most), or an archive restore brought a trajectory back with its old completion time
  (``cursors_reset``: every cursor back to the head).

A pull advances a cursor with ``UPDATE ... WHERE epoch = <the epoch it read>``: a rewind that
committed after the pull read the queue (its snapshot still showed the units taken) bumped
the epoch, so that pull's advance writes nothing. A rewind that runs while the pull's advance
is uncommitted waits for its row lock and applies on top of it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable

from django.conf import settings
from django.db.models import BigIntegerField, Case, DateTimeField, F, Q, QuerySet, Value, When
from django.utils import timezone

from pool import compiled
from pool.models import PromptGroup, Trajectory

from ..models import Delivery, PullCursor

MAX_KEY = 2**63 - 1
# The queues a cursor serves: kind -> (model, its ready-time field).
QUEUES = {
    Delivery.Kind.GROUP: (PromptGroup, "ready_at"),
    Delivery.Kind.TRAJECTORY: (Trajectory, "completed_at"),
}


class Cursors:
    """One pull's cursors of its consumer on one dataset's two queues: where to read from
    (``position``), what the first read found (``found``) and the positions it proves
    (``advance``)."""

    def __init__(self, *, consumer_id: int, dataset_id: int, version_id: int, current: int | None) -> None:
        self.consumer_id, self.dataset_id = consumer_id, dataset_id
        self.version_id, self.current = version_id, current
        self.cap = timezone.now() - dt.timedelta(seconds=settings.CLAW_PULL_CURSOR_LAG_SECONDS)
        self.epoch: dict[int, int] = {}  # kind -> the epoch read (no row: absent)
        self.floor: dict[int, tuple[dt.datetime, int]] = {}  # kind -> a valid position
        self.first: dict[int, tuple[dt.datetime, int] | None] = {}  # kind -> first untaken unit
        rows = compiled.read(_cursor_rows, consumer_id=consumer_id, dataset_id=dataset_id)
        for kind, epoch, at, key, version, policy in rows:
            self.epoch[kind] = epoch
            if at is not None and version == version_id and self._holds(policy):
                self.floor[kind] = (at, key)

    def _holds(self, policy: int | None) -> bool:
        """Drops that held under current version ``policy`` hold now (consume.skip_holds:
        a drop made under version p holds while the current version is at least p)."""
        return policy is None or (self.current is not None and self.current >= policy)

    def position(self, kind: int) -> tuple[dt.datetime, int] | None:
        """Where queue ``kind`` is read from: past this (ready time, id), every unit at or
        before it being taken (``after_position``); None: from the head."""
        return self.floor.get(kind)

    def found(self, kind: int, first: tuple[dt.datetime, int] | None) -> None:
        """The first untaken unit the pull's first read of queue ``kind`` returned (None:
        none), read past ``position``: every unit before it is taken."""
        self.first.setdefault(kind, first)

    def advance(self) -> None:
        """Write the positions this pull's reads proved (one statement): just before the
        first untaken unit, never past ``cap``. A cursor rewound since it was read is left
        as the rewind left it; a consumer's first pull creates its rows without a position."""
        missing = [kind for kind in self.first if kind not in self.epoch]
        if missing:
            PullCursor.objects.bulk_create(
                [
                    PullCursor(consumer_id=self.consumer_id, dataset_id=self.dataset_id, kind=k)
                    for k in missing
                ],
                ignore_conflicts=True,
            )
        moves: dict[int, tuple[dt.datetime, int]] = {}
        for kind, first in self.first.items():
            if kind in missing:
                continue
            new = (self.cap, MAX_KEY) if first is None else min((first[0], first[1] - 1), (self.cap, MAX_KEY))
            if self.floor.get(kind) is None or new > self.floor[kind]:
                moves[kind] = new
        if not moves:
            return
        which = Q()
        for kind in moves:
            which |= Q(kind=kind, epoch=self.epoch[kind])
        PullCursor.objects.filter(which, consumer_id=self.consumer_id, dataset_id=self.dataset_id).update(
            at=Case(
                *[
                    When(kind=k, then=Value(at, output_field=DateTimeField()))
                    for k, (at, _key) in moves.items()
                ]
            ),
            key=Case(
                *[
                    When(kind=k, then=Value(key, output_field=BigIntegerField()))
                    for k, (_at, key) in moves.items()
                ]
            ),
            dataset_version_id=self.version_id,
            policy_version=self.current,
            updated_at=timezone.now(),
        )


def _cursor_rows(*, consumer_id: int, dataset_id: int) -> QuerySet:
    """The build of a consumer's cursors' read (pool/compiled.py)."""
    return PullCursor.objects.filter(consumer_id=consumer_id, dataset_id=dataset_id).values_list(
        "kind", "epoch", "at", "key", "dataset_version_id", "policy_version"
    )


def after_position(qs: QuerySet, at: str, f_at: dt.datetime, f_key: int) -> QuerySet:
    """``qs`` (a queue ordered by ``at``, id) past the position (``f_at``, ``f_key``)."""
    # The first condition is the index's range; the second the exact tuple order.
    return qs.filter(Q(**{f"{at}__gte": f_at}), Q(**{f"{at}__gt": f_at}) | Q(id__gt=f_key))


def _back_to(at: dt.datetime, key: int) -> dict:
    """An UPDATE's assignments that move a cursor past (``at``, ``key``) back to it (one
    already at or before it stays) and bump its epoch, so a pull that read the queue before
    the move advances nothing: every rewind is this."""
    past = Q(at__gt=at) | Q(at=at, key__gt=key)
    return {
        "at": Case(When(past, then=Value(at, output_field=DateTimeField())), default=F("at")),
        "key": Case(When(past, then=Value(key, output_field=BigIntegerField())), default=F("key")),
        "epoch": F("epoch") + 1,
    }


def cursors_rewind(given_back: Iterable[tuple[int, int, int, int]]) -> None:
    """Units given back (consumer id, dataset id, kind, key), their Delivery rows deleted in
    this transaction: each cursor of theirs moves to just before the earliest of them and
    its epoch rises (so a pull that read the queue before this commits advances nothing)."""
    keys: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for consumer_id, dataset_id, kind, key in given_back:
        if kind in QUEUES:
            keys[(consumer_id, dataset_id, kind)].append(key)
    for (consumer_id, dataset_id, kind), ids in keys.items():
        model, at = QUEUES[kind]
        earliest = (
            model.objects.filter(id__in=ids, **{f"{at}__isnull": False})
            .order_by(at, "id")
            .values_list(at, "id")
            .first()
        )
        moved = _back_to(earliest[0], earliest[1] - 1) if earliest else {"epoch": F("epoch") + 1}
        PullCursor.objects.filter(consumer_id=consumer_id, dataset_id=dataset_id, kind=kind).update(**moved)


def cursors_rewind_recent(*, now: dt.datetime | None = None) -> int:
    """Every cursor no later than two retention sweep intervals (plus the lag) before now,
    and every epoch bumped: run by each retention sweep, so a unit whose readiness committed
    later than the lag after it was stamped is found by the next pull after the sweep. What
    a pull re-reads after it is what its consumer took in that window, not its whole queue.
    Returns the cursors moved."""
    now = now or timezone.now()
    since = now - dt.timedelta(
        seconds=2 * settings.CLAW_RETENTION_SECONDS + settings.CLAW_PULL_CURSOR_LAG_SECONDS
    )
    moved = PullCursor.objects.filter(Q(at__gt=since) | Q(at=since, key__gt=0)).count()
    PullCursor.objects.update(**_back_to(since, 0))
    return moved


def cursors_reset() -> int:
    """Every cursor back to the head of its queue (its next pull reads from the head and
    writes the position it finds): after an archive restore, whose trajectories keep their
    old completion times. Returns the cursors reset."""
    # Every row, those without a position too: a pull that read the queue before this
    # committed must not write the position it found.
    return PullCursor.objects.update(at=None, key=0, epoch=F("epoch") + 1)
