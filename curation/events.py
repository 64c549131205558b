"""Curation's events (snapshots, leases) and their live effects.

A curation service emits one of these through the pool's one effects registry
(the bus, pool/bus.py); the effects below publish the live dashboard's ``snapshot`` and
``lease`` events (typed in pool/live_payloads.py), and curation/tasks.py enqueues a requested
build. All are registered in curation/apps.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from pool import live
from pool.live_payloads import LeaseItem

from .models import Snapshot


@dataclass(slots=True, frozen=True)
class SnapshotRequested:
    """A snapshot was created: its build is wanted after the commit."""

    snapshot_id: str


@dataclass(slots=True, frozen=True)
class DatasetVersionCurrent:
    """A dataset has a new current version (created, or a new spec): its count
    (services/counts.py) is built after the commit."""

    version_id: int


@dataclass(slots=True, frozen=True)
class SnapshotChanged:
    """A snapshot's status or progress changed: ``steps`` written of ``total`` (None while
    unknown)."""

    snapshot_id: str
    status: str
    steps: int
    total: int | None


@dataclass(slots=True, frozen=True)
class LeaseChanged:
    """A lease was taken (``taken``) or acknowledged (``acked``)."""

    lease_id: str
    consumer: str
    dataset: str
    status: str
    steps: int
    taken: int = 0
    acked: int = 0


def snapshot_live(event: SnapshotChanged) -> None:
    """The live ``snapshot`` event (topics consumption and ``snapshot.<id>``): its status,
    steps written and progress (0..1; 0 while the total is unknown)."""
    if event.status == Snapshot.Status.DONE:
        progress = 1.0
    else:
        progress = round(event.steps / event.total, 4) if event.total else 0.0
    live.send(
        {
            "kind": "snapshot",
            "data": {
                "id": event.snapshot_id,
                "status": event.status,
                "progress": progress,
                "steps": event.steps,
            },
        },
        topics=("consumption", f"snapshot.{event.snapshot_id}"),
    )


def lease_live(event: LeaseChanged) -> None:
    """The live ``lease`` event (after the commit)."""
    item: LeaseItem = {
        "id": event.lease_id,
        "consumer": event.consumer,
        "dataset": event.dataset,
        "status": event.status,
        "steps": event.steps,
    }
    live.send({"kind": "lease", "data": {"taken": event.taken, "acked": event.acked, "items": [item]}})
