"""Retention: what leaves the pool, archived first when the policy says so, and archives read
back (docs/operations.md, "Retention and archives").

**The unit** is a whole prompt group (or a trajectory without a group): pulls, merges and
readiness work a group at a time, and a step's token parent is always in its own group, so
removing whole groups leaves every kept step's ids exactly as they were (pool/services/
purge.py re-bases a kept step whose parent would still go). A group is a candidate once none
of its rollouts runs.

**The rules** of a policy (curation.models.RetentionPolicy), all that are set must hold:
``older_than_days`` (its last activity, the latest ``updated_at`` of its trajectories, is
older), ``keep_newest_steps`` (it is not among the newest groups that together hold that
many steps), ``consumed`` (some dataset with consumers admits it, and every consumer of every
dataset admitting it has it acked). Scope: a source's groups, or a dataset's (the groups its
consumers were served; its ``consumed`` rule counts that dataset alone).

**Pins**, never removed whatever the rules say: what a lease delivered while it is open or
within its replay window (CLAW_RETENTION_REPLAY_DAYS), and the steps of every snapshot that is
kept (not failed); a dataset version pins through its snapshots and leases. Other apps add
pins with :func:`pin` (a function of the candidate units returning those it pins).

**A pass** (:func:`retention_run`) works in chunks of CHUNK_GROUPS units, each one
transaction: pins re-read under the chunk, the archive part written and recorded, then the
rows removed. A pass killed midway leaves whole chunks done and the rest untouched; the next
pass goes on (idempotent: what is gone is not a candidate). ``dry_run`` counts and removes
nothing (the admin shows it before anything goes).

**Archives**: each chunk's steps as one Parquet file in STORAGES["archives"] (the snapshot
writer's token columns, list<int32> / list<float64>, plus what a restore needs: the raw step,
trajectory and group fields; images by reference, their sha256), its sha256 recorded on the
Archive row as it is written, and ``manifest.json`` beside the parts (counts, each file's
sha256 and size, the policy). :func:`archive_restore` verifies every file's sha256 and writes
the rows back through the pool's one write path, idempotently.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import connection, transaction
from django.db.models import Exists, Max, OuterRef, Q, Sum
from django.utils import timezone

from pool import tokens
from pool.ingest.contract import StepIn
from pool.ingest.media import ImageIn
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Source, Step, StepMedia, Trajectory
from pool.services.groups import group_upsert
from pool.services.purge import groups_purge
from pool.services.trajectories import CompletionIn, trajectories_complete

from ..models import Archive, Delivery, Lease, RetentionPolicy, Run, Snapshot
from ..selectors.specs import spec_compile, units_admitted
from ..snapshot_files import parquet
from ..specs import spec_parse
from .cursors import cursors_reset, cursors_rewind_recent

log = logging.getLogger(__name__)

# Units (groups, or trajectories without a group) per transaction of a pass: 200 groups of
# W-pool's 32 steps (6,400 steps, ~10 MB of token bytes) archive and go in about 1-2 s here,
# short enough not to hold the trajectories' locks against the writers for long.
CHUNK_GROUPS = 200

Unit = int  # a group's id, or minus a lone trajectory's id (as units_admitted keys them)
Pin = Callable[[list[Unit]], set[Unit]]
_pins: list[Pin] = []


def pin(fn: Pin) -> Pin:
    """Register ``fn(units) -> the units it pins`` (idempotent), e.g. from an AppConfig.ready()."""
    if fn not in _pins:
        _pins.append(fn)
    return fn


@dataclass(slots=True)
class Report:
    """What a pass did (or, dry, would do)."""

    policy: str
    dry_run: bool
    candidates: int = 0  # units matching the rules
    pinned: int = 0
    forgotten_leases: int = 0  # leases left recording nothing the pool holds (leases_forget)
    groups: int = 0
    trajectories: int = 0
    steps: int = 0
    rebased: int = 0
    archive: str | None = None
    chunks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


# --- a pass ---------------------------------------------------------------------------------------
def duty_check(duty: float | None, *, name: str = "duty") -> float:
    """``duty``, or CLAW_RETENTION_DUTY where None; ValueError outside (0, 1], naming the
    value as ``name`` (the settings check their own value as they load: they cannot import
    this)."""
    duty = settings.CLAW_RETENTION_DUTY if duty is None else duty
    if not 0 < duty <= 1:
        raise ValueError(f"{name} must be in (0, 1], not {duty!r}")
    return duty


def retention_run(
    *,
    policy: RetentionPolicy,
    dry_run: bool = False,
    now: dt.datetime | None = None,
    progress: Callable[[Report], None] | None = None,
    duty: float | None = None,
    rest: Callable[[float], None] | None = None,
) -> Report:
    """Apply ``policy`` (module docstring); ``dry_run`` removes nothing. Idempotent; each
    chunk is one transaction. Returns what it did, also kept on the policy (``last_report``).
    Between two chunks a pass rests (``rest(seconds)``, default ``time.sleep``) as long as
    its ``duty`` asks (default CLAW_RETENTION_DUTY): the chunk's time x (1 / duty - 1), none
    at a duty of 1 (an operator's run, waited for: the admin's "Run now")."""
    now = now or timezone.now()
    report = Report(policy=policy.name, dry_run=dry_run)
    units = candidates(policy, now=now)
    report.candidates = len(units)
    archive: Archive | None = None
    idle = 1 / duty_check(duty) - 1
    rest = rest or time.sleep
    worked = 0.0  # the last chunk's seconds
    for start in range(0, len(units), CHUNK_GROUPS):
        if start and idle > 0 and not dry_run:
            rest(worked * idle)
        began = time.monotonic()
        chunk = units[start : start + CHUNK_GROUPS]
        with transaction.atomic():
            # Lock the units' trajectories before reading their pins: every writer of their
            # steps locks them first, and so does a delivery (a pull, a snapshot's freeze:
            # pool/services/delivery.py), so a delivery either committed its pin before this
            # read or waits and finds the unit gone. Take only the units still ended: a
            # rollout that came back to life stays.
            of_units = Trajectory.objects.filter(
                Q(group_id__in=[u for u in chunk if u > 0]) | Q(id__in=[-u for u in chunk if u < 0])
            )
            if not dry_run:
                of_units = of_units.select_for_update()
            running = {  # as units: a group's id, minus a lone trajectory's
                g if g is not None else -t
                for g, t, status in of_units.order_by("id").values_list("group_id", "id", "status")
                if status == Trajectory.Status.RUNNING
            }
            pinned = pinned_units(chunk, now=now)
            keep = [u for u in chunk if u not in pinned]
            report.pinned += len(chunk) - len(keep)
            groups = [u for u in keep if u > 0 and u not in running]
            lone = [-u for u in keep if u < 0 and u not in running]
            if dry_run:
                report.groups += len(groups)
                report.trajectories += Trajectory.objects.filter(
                    Q(group_id__in=groups) | Q(id__in=lone)
                ).count()
                report.steps += (
                    Trajectory.objects.filter(Q(group_id__in=groups) | Q(id__in=lone)).aggregate(
                        n=Sum("step_count")
                    )["n"]
                    or 0
                )
            else:
                if policy.action == RetentionPolicy.Action.ARCHIVE and (groups or lone):
                    archive = archive or _archive_open(policy)
                    _archive_part(archive, groups, lone)
                holders = lease_holders(groups, lone)  # read while the units are there
                purged = groups_purge(group_ids=groups, trajectory_ids=lone)
                report.forgotten_leases += leases_forget(holders, now=now)
                report.groups += purged.groups
                report.trajectories += purged.trajectories
                report.steps += purged.steps
                report.rebased += purged.rebased
        worked = time.monotonic() - began
        report.chunks += 1
        if progress is not None:
            progress(report)
    if archive is not None:
        _archive_close(archive)
        report.archive = str(archive.id)
    if not dry_run:
        RetentionPolicy.objects.filter(id=policy.id).update(last_run_at=now, last_report=report.as_dict())
    return report


@dataclass(slots=True)
class Sweep:
    """What a retention sweep did: leases trimmed, each policy's pass, the undelivered leases
    forgotten (those of removed units are each pass's ``forgotten_leases``)."""

    trimmed_leases: int
    reports: list[Report]
    forgotten_undelivered: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "trimmed_leases": self.trimmed_leases,
            "reports": [r.as_dict() for r in self.reports],
            "forgotten_undelivered": self.forgotten_undelivered,
        }


def retention_sweep(
    *,
    now: dt.datetime | None = None,
    progress: Callable[[Report], None] | None = None,
    duty: float | None = None,
) -> Sweep:
    """The leases' served batches past their replay window (``leases_trim``), the pull
    cursors back over the last two sweep intervals (``cursors_rewind_recent``), every
    enabled policy in name order (each forgets the leases of what it removed; ``progress``
    is told of each chunk; ``duty`` paces them: ``retention_run``), then the leases holding
    no delivery (``leases_forget_undelivered``). Celery beat, ``manage.py retention_run``."""
    trimmed = leases_trim(now=now)
    if trimmed:
        log.info("retention: %d leases past their replay window kept their manifest only", trimmed)
    # A unit stamped ready by a commit slower than the pull cursors' lag waits one sweep at
    # most (services.cursors).
    cursors_rewind_recent(now=now)
    reports = [
        retention_run(policy=p, now=now, progress=progress, duty=duty)
        for p in RetentionPolicy.objects.filter(enabled=True).order_by("name")
    ]
    forgotten = leases_forget_undelivered(now=now)
    if forgotten:
        log.info("retention: %d nacked or expired leases past their replay window were forgotten", forgotten)
    return Sweep(trimmed, reports, forgotten)


# --- leases' served batches -----------------------------------------------------------------------
# Leases trimmed per transaction, and per run (the next run goes on).
TRIM_CHUNK = 200
MAX_TRIM_ROUNDS = 50


def leases_trim(*, now: dt.datetime | None = None) -> int:
    """Past its replay window (CLAW_RETENTION_REPLAY_DAYS from its pull) a lease that is no
    longer open keeps its manifest (verdicts check their steps against it; the pages show
    it) and drops its served batch: its body becomes ``{"lease_id", "manifest", "batch":
    null}``, ``batch_dropped_at`` says when, and the replay (GET /api/v1/leases/{id}/batch)
    answers 410. Each lease kept the exact bytes it served (about 180 KB for 64 W-growth
    steps): the soak's disk grew by its leases, not its steps (docs/operations.md). A lease
    of a consumer with a training run is lineage and keeps its batch whole (the run's replay,
    GET /api/v1/runs/{uid}/replay, serves it byte for byte). Run by the retention sweep;
    idempotent, bounded per run; returns how many leases it trimmed."""
    now = now or timezone.now()
    cutoff = now - dt.timedelta(days=settings.CLAW_RETENTION_REPLAY_DAYS)
    trimmed = 0
    for _ in range(MAX_TRIM_ROUNDS):
        with transaction.atomic():
            rows = list(
                Lease.objects.select_for_update(skip_locked=connection.vendor == "postgresql")
                .filter(created_at__lt=cutoff, batch_dropped_at__isnull=True)
                .exclude(status=Lease.Status.LEASED)
                .exclude(Exists(Run.objects.filter(consumer_id=OuterRef("consumer_id"))))
                .order_by("created_at")
                .values_list("id", "body")[:TRIM_CHUNK]
            )
            trimmed_rows = []
            for lease_id, body in rows:
                doc = orjson.loads(bytes(body))
                kept = {"lease_id": doc.get("lease_id"), "manifest": doc.get("manifest"), "batch": None}
                trimmed_rows.append(Lease(id=lease_id, body=orjson.dumps(kept), batch_dropped_at=now))
            # One UPDATE per chunk, not one per lease.
            Lease.objects.bulk_update(trimmed_rows, ["body", "batch_dropped_at"])
        trimmed += len(rows)
        if len(rows) < TRIM_CHUNK:
            break
    return trimmed


def lease_holders(groups: Iterable[int], lone: Iterable[int]) -> list[uuid.UUID]:
    """The leases that delivered any of these units (groups, lone trajectories, or one of
    their steps), whichever consumer took them: one read (Delivery's ``delivery_unit``)."""
    groups, lone = list(groups), list(lone)
    if not groups and not lone:
        return []
    steps = Step.objects.filter(Q(trajectory__group_id__in=groups) | Q(trajectory_id__in=lone)).values("id")
    return list(
        Delivery.objects.filter(
            Q(kind=Delivery.Kind.GROUP, key__in=groups)
            | Q(kind=Delivery.Kind.TRAJECTORY, key__in=lone)
            | Q(kind=Delivery.Kind.STEP, key__in=steps)
        )
        .values_list("lease_id", flat=True)
        .distinct()
    )


def leases_forget(lease_ids: Iterable[uuid.UUID], *, now: dt.datetime | None = None) -> int:
    """Forget those of these leases that record nothing the pool still holds: past their
    replay window, no longer open, not lineage (no training run of their consumer: a
    checkpoint's leases are its run's), and every unit they delivered (a group, a lone trajectory, a step) gone. Each
    goes with its delivery rows (their units are gone: nothing can be delivered twice) and
    its verdicts. A retention pass calls it with the leases of the units it just removed
    (``lease_holders``), so its work follows what a pass removes, never the leases' history.
    Without it every pull left a row (and its manifest, ~10 KB for 256 steps) for ever, the
    largest part of bench.growth's soak drift; the lease counts of the consumption page and
    the dashboard are of the leases on record. Idempotent; returns how many."""
    return _forget(Lease.objects.filter(id__in=list(lease_ids)), now=now)


def leases_forget_undelivered(*, now: dt.datetime | None = None) -> int:
    """The same for the leases that hold no delivery at all (a nack or an expiry gave their
    units back): no pass reaches them through their units. Run by the retention sweep;
    bounded per run (the next run goes on)."""
    forgotten = 0
    for _ in range(MAX_TRIM_ROUNDS):
        with transaction.atomic():
            done = _forget(
                Lease.objects.filter(status__in=[Lease.Status.RELEASED, Lease.Status.EXPIRED]),
                now=now,
                most=TRIM_CHUNK,
            )
        forgotten += done
        if done < TRIM_CHUNK:
            break
    return forgotten


def _forget(leases, *, now: dt.datetime | None, most: int | None = None) -> int:
    """Delete those of ``leases`` that qualify (``leases_forget``); at most ``most``."""
    cutoff = (now or timezone.now()) - dt.timedelta(days=settings.CLAW_RETENTION_REPLAY_DAYS)
    # A delivery whose unit is still in the pool.
    alive = Delivery.objects.filter(lease_id=OuterRef("pk")).filter(
        Q(kind=Delivery.Kind.GROUP) & Q(Exists(PromptGroup.objects.filter(id=OuterRef("key"))))
        | Q(kind=Delivery.Kind.TRAJECTORY) & Q(Exists(Trajectory.objects.filter(id=OuterRef("key"))))
        | Q(kind=Delivery.Kind.STEP) & Q(Exists(Step.objects.filter(id=OuterRef("key"))))
    )
    ids = (
        leases.filter(created_at__lt=cutoff)
        .exclude(status=Lease.Status.LEASED)
        # lineage: a consumer with a training run (a checkpoint's leases are its run's)
        .exclude(Exists(Run.objects.filter(consumer_id=OuterRef("consumer_id"))))
        .exclude(Exists(alive))
        .order_by("created_at")
        .values_list("id", flat=True)
    )
    ids = list(ids[:most] if most is not None else ids)
    if ids:
        Lease.objects.filter(id__in=ids).delete()
    return len(ids)


# --- which units ------------------------------------------------------------------------------------
def candidates(policy: RetentionPolicy, *, now: dt.datetime) -> list[Unit]:
    """The units the policy's rules select, oldest activity first (pins not applied)."""
    rows = _ended_units(policy)
    if policy.older_than_days is not None:
        cutoff = now - dt.timedelta(days=policy.older_than_days)
        rows = [r for r in rows if r[1] < cutoff]
    if policy.keep_newest_steps is not None:
        kept, newest = 0, set()
        for unit, _, n in sorted(_all_units(policy), key=lambda r: r[1], reverse=True):
            if kept >= policy.keep_newest_steps:
                break
            kept += n
            newest.add(unit)
        rows = [r for r in rows if r[0] not in newest]
    units = [u for u, _, _ in sorted(rows, key=lambda r: (r[1], r[0]))]
    if policy.consumed:
        units = [u for u in units if u in _consumed(units, policy)]
    return units


def _scope(policy: RetentionPolicy) -> Q:
    q = Q()
    if policy.source_id is not None:
        q &= Q(source_id=policy.source_id)
    if policy.dataset_id is not None:
        served = Delivery.objects.filter(dataset_id=policy.dataset_id)
        q &= Q(group_id__in=served.filter(kind=Delivery.Kind.GROUP).values("key")) | Q(
            id__in=served.filter(kind=Delivery.Kind.TRAJECTORY).values("key")
        )
    return q


def _all_units(policy: RetentionPolicy) -> list[tuple[Unit, dt.datetime, int]]:
    """(unit, last activity, steps) of every unit in the policy's source scope."""
    scope = Q(source_id=policy.source_id) if policy.source_id is not None else Q()
    trajs = Trajectory.objects.filter(scope)
    grouped = (
        trajs.filter(group__isnull=False)
        .values("group_id")
        .annotate(last=Max("updated_at"), n=Sum("step_count"))
        .values_list("group_id", "last", "n")
        .order_by()
    )
    lone = trajs.filter(group__isnull=True).values_list("id", "updated_at", "step_count")
    return [(g, last, n or 0) for g, last, n in grouped] + [(-t, last, n) for t, last, n in lone]


def _ended_units(policy: RetentionPolicy) -> list[tuple[Unit, dt.datetime, int]]:
    """(unit, last activity, steps) of the units in scope none of whose rollouts runs."""
    trajs = Trajectory.objects.filter(_scope(policy))
    running_groups = Trajectory.objects.filter(status=Trajectory.Status.RUNNING, group__isnull=False).values(
        "group_id"
    )
    grouped = (
        trajs.filter(group__isnull=False)
        .exclude(group_id__in=running_groups)
        .values("group_id")
        .annotate(last=Max("updated_at"), n=Sum("step_count"))
        .values_list("group_id", "last", "n")
        .order_by()
    )
    lone = (
        trajs.filter(group__isnull=True)
        .exclude(status=Trajectory.Status.RUNNING)
        .values_list("id", "updated_at", "step_count")
    )
    return [(g, last, n or 0) for g, last, n in grouped] + [(-t, last, n) for t, last, n in lone]


def pinned_units(units: list[Unit], *, now: dt.datetime) -> set[Unit]:
    """Which of ``units`` are pinned (module docstring)."""
    if not units:
        return set()
    groups = [u for u in units if u > 0]
    lone = [-u for u in units if u < 0]
    of_step = _unit_of_steps(groups, lone)
    pinned: set[Unit] = set()
    # Leases open, or within their replay window.
    window = now - dt.timedelta(days=settings.CLAW_RETENTION_REPLAY_DAYS)
    recent = Lease.objects.filter(Q(status=Lease.Status.LEASED) | Q(created_at__gte=window)).values("id")
    for kind, key in (
        Delivery.objects.filter(lease_id__in=recent)
        .filter(
            Q(kind=Delivery.Kind.GROUP, key__in=groups)
            | Q(kind=Delivery.Kind.TRAJECTORY, key__in=lone)
            | Q(kind=Delivery.Kind.STEP, key__in=list(of_step))
        )
        .values_list("kind", "key")
    ):
        if kind == Delivery.Kind.GROUP:
            pinned.add(key)
        elif kind == Delivery.Kind.TRAJECTORY:
            pinned.add(-key)
        else:
            pinned.add(of_step[key])
    # Snapshots kept (every one that did not fail): their frozen steps.
    for ids in (
        Snapshot.objects.exclude(status=Snapshot.Status.FAILED)
        .exclude(step_ids=None)
        .values_list("step_ids", flat=True)
    ):
        pinned.update(of_step[s] for s in ids if s in of_step)
    for fn in _pins:
        pinned |= fn(units)
    return pinned


def _unit_of_steps(groups: list[int], lone: list[int]) -> dict[int, Unit]:
    rows = Step.objects.filter(Q(trajectory__group_id__in=groups) | Q(trajectory_id__in=lone)).values_list(
        "id", "trajectory_id", "trajectory__group_id"
    )
    return {sid: gid if gid is not None else -tid for sid, tid, gid in rows}


def _consumed(units: list[Unit], policy: RetentionPolicy) -> set[Unit]:
    """The units some dataset with consumers admits and every consumer of every dataset
    admitting them has acked (policy.dataset: that dataset only)."""
    pairs = Delivery.objects.values_list("dataset_id", "consumer_id").distinct()
    if policy.dataset_id is not None:
        pairs = pairs.filter(dataset_id=policy.dataset_id)
    consumers: dict[int, set[int]] = {}
    for dataset_id, consumer_id in pairs:
        consumers.setdefault(dataset_id, set()).add(consumer_id)
    if not consumers or not units:
        return set()
    from ..models import Dataset

    seen: set[Unit] = set()
    blocked: set[Unit] = set()
    groups = [u for u in units if u > 0]
    lone = [-u for u in units if u < 0]
    rollouts = list(
        Trajectory.objects.filter(Q(group_id__in=groups) | Q(id__in=lone)).values_list("id", flat=True)
    )
    for dataset in Dataset.objects.filter(id__in=consumers).select_related("current"):
        if dataset.current is None:
            continue
        spec = spec_parse(dataset.current.spec)
        admitted = units_admitted(spec_compile(spec), rollouts)
        if not admitted:
            continue
        acked = Delivery.objects.filter(dataset_id=dataset.id, lease__status=Lease.Status.ACKED)
        whole = spec.grouping.keep_groups_whole
        for consumer in consumers[dataset.id]:
            mine = acked.filter(consumer_id=consumer)
            if whole:
                done = {
                    key if kind == Delivery.Kind.GROUP else -key
                    for kind, key in mine.filter(
                        Q(kind=Delivery.Kind.GROUP, key__in=groups)
                        | Q(kind=Delivery.Kind.TRAJECTORY, key__in=lone)
                    ).values_list("kind", "key")
                }
            else:
                steps_acked = set(
                    mine.filter(
                        kind=Delivery.Kind.STEP, key__in=[s for u in admitted.values() for s in u]
                    ).values_list("key", flat=True)
                )
                done = {u for u, steps in admitted.items() if set(steps) <= steps_acked}
            for unit in admitted:
                seen.add(unit)
                if unit not in done:
                    blocked.add(unit)
    return seen - blocked


# --- archives ---------------------------------------------------------------------------------------
# The snapshot writer's step columns, taken from its schema (the step's own reward, as stored;
# metadata as JSON), then the images by reference and what a restore needs besides.
SNAPSHOT_COLUMNS = (
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_index",
    "prompt_ids",
    "response_ids",
    "rollout_logprobs",
    "token_rewards",
    "token_versions",
    "reward",
    "reward_source",
    "policy_version",
    "token_source",
    "drift",
    "label",
    "metadata",
)
ARCHIVE_SCHEMA = pa.schema(
    [
        *(parquet.PARQUET_SCHEMA.field(name) for name in SNAPSHOT_COLUMNS),
        ("images", pa.list_(pa.string())),  # by reference, in order: "sha256:<hex>" or "url:<address>"
        ("is_last", pa.bool_()),
        ("finish_reason", pa.string()),
        ("drift_offset", pa.int64()),
        ("branch", pa.int32()),
        ("parent_step_uid", pa.string()),
        ("messages", pa.string()),  # JSON
        ("response_text", pa.string()),
        ("note", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
        ("trajectory", pa.string()),  # JSON: the trajectory's own fields
        ("group", pa.string()),  # JSON: the group's own fields (null: no group)
    ]
)


def _storage():
    return storages["archives"]


def _archive_open(policy: RetentionPolicy) -> Archive:
    aid = uuid.uuid4()
    folder = f"{timezone.now():%Y/%m/%d}/{policy.name}-{aid.hex[:12]}"
    return Archive.objects.create(id=aid, policy=policy, policy_name=policy.name, folder=folder)


def _archive_part(archive: Archive, groups: list[int], lone: list[int]) -> None:
    """One Parquet file of these units' steps, stored and recorded (in the chunk's transaction:
    a chunk rolled back leaves a file that no Archive names, never a name without a file)."""
    table, counts = _archive_table(groups, lone)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    data = buf.getvalue()
    n = len(archive.files) + 1
    name = _storage().save(f"{archive.folder}/part-{n:05d}.parquet", ContentFile(data))
    archive.files = [
        *archive.files,
        {
            "name": name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "steps": table.num_rows,
            **counts,
        },
    ]
    archive.steps += table.num_rows
    archive.groups += counts["groups"]
    archive.trajectories += counts["trajectories"]
    archive.save(update_fields=["files", "steps", "groups", "trajectories"])


def _archive_close(archive: Archive) -> None:
    """The manifest beside the parts: counts, each file's sha256, the policy."""
    manifest = {
        "archive": str(archive.id),
        "policy": archive.policy_name,
        "rules": _rules(archive.policy),
        "created_at": archive.created_at.isoformat(),
        "steps": archive.steps,
        "groups": archive.groups,
        "trajectories": archive.trajectories,
        "files": archive.files,
        "schema": [f.name for f in ARCHIVE_SCHEMA],
    }
    _storage().save(
        f"{archive.folder}/manifest.json", ContentFile(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
    )


def _rules(policy: RetentionPolicy | None) -> dict[str, Any]:
    if policy is None:
        return {}
    return {
        "action": policy.action,
        "source": policy.source.name if policy.source_id else None,
        "dataset": policy.dataset.name if policy.dataset_id else None,
        "older_than_days": policy.older_than_days,
        "keep_newest_steps": policy.keep_newest_steps,
        "consumed": policy.consumed,
    }


_STEP_COLUMNS = (
    "id",
    "uid",
    "trajectory_id",
    "step_index",
    "prompt_len",
    "rollout_logprobs",
    "token_rewards",
    "token_versions",
    "reward",
    "reward_source",
    "policy_version_id",
    "token_source",
    "drift",
    "label",
    "metadata",
    "is_last",
    "finish_reason",
    "drift_offset",
    "branch",
    "parent_step_id",
    "messages",
    "response_text",
    "note",
    "created_at",
)


def _archive_table(groups: list[int], lone: list[int]) -> tuple[pa.Table, dict[str, int]]:
    trajs = {
        t["id"]: t
        for t in Trajectory.objects.filter(Q(group_id__in=groups) | Q(id__in=lone)).values(
            "id",
            "uid",
            "group_id",
            "source__name",
            "channel",
            "status",
            "reward",
            "reward_source",
            "policy_version_id",
            "metadata",
            "created_at",
            "completed_at",
        )
    }
    group_rows = {
        g["id"]: g
        for g in PromptGroup.objects.filter(id__in=groups).values(
            "id",
            "uid",
            "expected_rollouts",
            "status",
            "dataset",
            "ground_truth",
            "metadata",
            "task__uid",
            "source__name",
        )
    }
    rows = list(
        Step.objects.filter(trajectory_id__in=trajs)
        .order_by("trajectory_id", "step_index")
        .values_list(*_STEP_COLUMNS)
    )
    full = tokens.load_sequences(r[0] for r in rows)
    uid_of = dict(Step.objects.filter(id__in={r[19] for r in rows if r[19]}).values_list("id", "uid"))
    images: dict[int, list[str]] = {}
    for sid, sha, url in (
        StepMedia.objects.filter(step_id__in=[r[0] for r in rows])
        .order_by("step_id", "position")
        .values_list("step_id", "media__sha256", "source_url")
    ):
        images.setdefault(sid, []).append(f"sha256:{sha}" if sha else f"url:{url}")
    cols: dict[str, list[Any]] = {f.name: [] for f in ARCHIVE_SCHEMA}
    for r in rows:
        (sid, uid, tid, index, prompt_len, lp, tr, tv, reward, rsource, pv, tsource, drift, label, meta) = r[
            :15
        ]
        (is_last, finish, drift_offset, branch, parent, messages, text, note, created) = r[15:]
        t = trajs[tid]
        g = group_rows.get(t["group_id"])
        ids = tokens.bytes_to_ids(full[sid])
        cols["uid"].append(uid)
        cols["trajectory_uid"].append(t["uid"])
        cols["prompt_group_uid"].append(g["uid"] if g else None)
        cols["step_index"].append(index)
        cols["prompt_ids"].append(ids[:prompt_len])
        cols["response_ids"].append(ids[prompt_len:])
        cols["rollout_logprobs"].append(
            np.frombuffer(lp, dtype=tokens.LOGPROB_DTYPE) if lp is not None else None
        )
        cols["token_rewards"].append(
            np.frombuffer(tr, dtype=tokens.LOGPROB_DTYPE) if tr is not None else None
        )
        cols["token_versions"].append(
            tokens.runs_expand(tokens.bytes_to_runs(tv)) if tv is not None else None
        )
        cols["reward"].append(reward)
        cols["reward_source"].append(rsource)
        cols["policy_version"].append(pv)
        cols["token_source"].append(tsource)
        cols["drift"].append(drift)
        cols["label"].append(label)
        cols["metadata"].append(orjson.dumps(meta).decode())
        cols["images"].append(images.get(sid, []))
        cols["is_last"].append(is_last)
        cols["finish_reason"].append(finish)
        cols["drift_offset"].append(drift_offset)
        cols["branch"].append(branch)
        cols["parent_step_uid"].append(uid_of.get(parent) if parent else None)
        cols["messages"].append(orjson.dumps(messages).decode() if messages is not None else None)
        cols["response_text"].append(text)
        cols["note"].append(note)
        cols["created_at"].append(created)
        cols["trajectory"].append(orjson.dumps(_trajectory_fields(t)).decode())
        cols["group"].append(orjson.dumps(_group_fields(g)).decode() if g else None)
    arrays = [
        pa.array([None if v is None else list(v) for v in cols[f.name]], type=f.type)
        if pa.types.is_list(f.type) and f.name != "images"
        else pa.array(cols[f.name], type=f.type)
        for f in ARCHIVE_SCHEMA
    ]
    table = pa.Table.from_arrays(arrays, schema=ARCHIVE_SCHEMA)
    return table, {"groups": len(group_rows), "trajectories": len(trajs)}


def _trajectory_fields(t: dict[str, Any]) -> dict[str, Any]:
    return {
        "source": t["source__name"],
        "channel": t["channel"],
        "status": t["status"],
        "reward": t["reward"],
        "reward_source": t["reward_source"],
        "policy_version": t["policy_version_id"],
        "metadata": t["metadata"],
        "created_at": t["created_at"].isoformat() if t["created_at"] else None,
        "completed_at": t["completed_at"].isoformat() if t["completed_at"] else None,
    }


def _group_fields(g: dict[str, Any]) -> dict[str, Any]:
    return {
        "expected_rollouts": g["expected_rollouts"],
        "status": g["status"],
        "dataset": g["dataset"],
        "ground_truth": g["ground_truth"],
        "metadata": g["metadata"],
        "task": g["task__uid"],
        "source": g["source__name"],
    }


# --- restore ---------------------------------------------------------------------------------------
class ArchiveError(Exception):
    """An archive that cannot be restored as it is (a file missing or changed)."""


def archive_restore(*, archive: Archive) -> dict[str, int]:
    """Bring an archive's groups back into the pool, through the one write path (steps_ingest,
    group and trajectory services). Idempotent: steps already in the pool are left as they are.
    Every file's sha256 is checked first (ArchiveError names the file). The steps' own fields,
    ids and timestamps read as they did when archived; what the pool derives (readiness,
    effective rewards, quality) is derived again."""
    tables = []
    for f in archive.files:
        try:
            with _storage().open(f["name"], "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            raise ArchiveError(f"{f['name']}: missing from the archive storage") from None
        if hashlib.sha256(data).hexdigest() != f["sha256"]:
            raise ArchiveError(f"{f['name']}: its sha256 is not the one recorded")
        tables.append(pq.read_table(io.BytesIO(data)))
    restored = {"steps": 0, "trajectories": 0, "groups": 0}
    for table in tables:
        rows = table.to_pylist()
        by_traj: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_traj.setdefault(r["trajectory_uid"], []).append(r)
        with transaction.atomic():
            for counted in _restore_rows(by_traj):
                for k, v in counted.items():
                    restored[k] += v
    Archive.objects.filter(id=archive.id).update(restored_at=timezone.now())
    # Restored lone trajectories keep their old completion times: behind any pull cursor.
    cursors_reset()
    return restored


def _restore_rows(by_traj: dict[str, list[dict[str, Any]]]) -> Iterable[dict[str, int]]:
    sources = {s.name: s.id for s in Source.objects.all()}
    for traj_uid, rows in by_traj.items():
        first = rows[0]
        t = orjson.loads(first["trajectory"])
        g = orjson.loads(first["group"]) if first["group"] else None
        source_id = sources.get(t["source"]) if t["source"] else None
        counted = {"steps": 0, "trajectories": 0, "groups": 0}
        if g is not None and not PromptGroup.objects.filter(uid=first["prompt_group_uid"]).exists():
            group_upsert(
                uid=first["prompt_group_uid"],
                expected_rollouts=g["expected_rollouts"],
                dataset=g["dataset"] or None,
                ground_truth=g["ground_truth"],
                metadata=g["metadata"],
                task=g["task"],
                source_id=sources.get(g["source"]) if g["source"] else None,
                sources=None,
            )
            counted["groups"] += 1
        existed = Trajectory.objects.filter(uid=traj_uid).exists()
        result = steps_ingest(
            steps=[_step_in(r, i) for i, r in enumerate(rows)],
            source_id=source_id,
            channel=t["channel"],
            sources=None,
        )
        created = result.created_uids
        counted["steps"] += len(created)
        if not existed:
            counted["trajectories"] += 1
            _restore_trajectory(traj_uid, t, rows)
        if created:
            _restore_step_fields(rows, set(created))
        yield counted


def _step_in(r: dict[str, Any], i: int) -> StepIn:
    versions = r["token_versions"]
    return StepIn(
        uid=r["uid"],
        trajectory_uid=r["trajectory_uid"],
        prompt_group_uid=r["prompt_group_uid"],
        step_index=r["step_index"],
        prompt_ids=np.asarray(r["prompt_ids"], dtype=tokens.TOKEN_DTYPE),
        response_ids=np.asarray(r["response_ids"], dtype=tokens.TOKEN_DTYPE),
        rollout_logprobs=np.asarray(r["rollout_logprobs"], dtype=np.float64)
        if r["rollout_logprobs"] is not None
        else None,
        token_rewards=np.asarray(r["token_rewards"], dtype=np.float64)
        if r["token_rewards"] is not None
        else None,
        token_policy_versions=_runs(versions) if versions is not None else None,
        reward=r["reward"],
        reward_source=r["reward_source"],
        policy_version=r["policy_version"],
        is_last=r["is_last"],
        finish_reason=r["finish_reason"],
        messages=orjson.loads(r["messages"]) if r["messages"] is not None else None,
        response_text=r["response_text"],
        metadata=orjson.loads(r["metadata"]),
        images=[_image_in(ref, f"steps[{i}].images[{k}]") for k, ref in enumerate(r["images"] or [])],
        token_source=r["token_source"],
        drift=r["drift"],
        drift_offset=r["drift_offset"],
        branch=r["branch"],
        field_prefix=f"steps[{i}]",
    )


def _image_in(ref: str, at: str) -> ImageIn:
    kind, _, value = ref.partition(":")
    return ImageIn(field=at, sha256=value) if kind == "sha256" else ImageIn(field=at, url=value)


def _runs(values: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return runs


def _restore_trajectory(uid: str, t: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """The trajectory's end as it was: completed with its reward (or its other status), and
    its own fields and times."""
    traj = Trajectory.objects.get(uid=uid)
    if t["status"] != Trajectory.Status.RUNNING and traj.status == Trajectory.Status.RUNNING:
        completion = CompletionIn(uid=uid, reward=t["reward"], status=t["status"])
        if t["reward"] is not None and t["reward_source"]:
            completion.reward_source = t["reward_source"]
        trajectories_complete(completions=[completion], sources=None)
    Trajectory.objects.filter(uid=uid).update(
        metadata=t["metadata"],
        policy_version_id=t["policy_version"],
        created_at=dt.datetime.fromisoformat(t["created_at"]) if t["created_at"] else timezone.now(),
        completed_at=dt.datetime.fromisoformat(t["completed_at"]) if t["completed_at"] else None,
    )


def _restore_step_fields(rows: list[dict[str, Any]], created: set[str]) -> None:
    """What steps_ingest does not take from a client: label, note, parent link, times."""
    ids = dict(Step.objects.filter(uid__in=[r["uid"] for r in rows]).values_list("uid", "id"))
    for r in rows:
        if r["uid"] not in created:
            continue
        Step.objects.filter(uid=r["uid"]).update(
            label=r["label"] or "",
            note=r["note"] or "",
            parent_step_id=ids.get(r["parent_step_uid"]) if r["parent_step_uid"] else None,
            created_at=r["created_at"],
        )


__all__ = [
    "ARCHIVE_SCHEMA",
    "CHUNK_GROUPS",
    "ArchiveError",
    "Report",
    "Sweep",
    "archive_restore",
    "candidates",
    "lease_holders",
    "leases_forget",
    "leases_forget_undelivered",
    "leases_trim",
    "pin",
    "pinned_units",
    "retention_run",
    "retention_sweep",
]
