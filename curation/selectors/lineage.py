"""Reads of lineage: training runs, their checkpoints, the data behind each checkpoint, the
checkpoints a step, a trajectory or a source's data trained, the difference between two
checkpoints' data, and a run replayed from its leases (curation/services/lineage.py).

Every list is keyset-paged (``after``: the last key of the previous page, ``limit``).
Tenancy, in the query (pool/tenancy.py): ``sources`` restricts the runs a caller sees
(``Run.source``) and, separately, the steps it sees behind them (``CheckpointStep.source``:
a trainer is served every source's data, so its reads of what trained its runs are every
source's; another reader's are its own sources'). A step removed before its checkpoint was
indexed has no source: only an unrestricted reader sees it.

Reads that need a checkpoint's steps index the checkpoints not indexed yet first
(services.lineage.checkpoints_index_pending): one query when there is none.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
from django.db.models import Count, Exists, OuterRef, Q

from pool import tenancy
from pool.models import Source, Step, Trajectory
from pool.tenancy import Sources

from ..models import Checkpoint, CheckpointStep, Lease, Run, Snapshot, StepVerdict
from ..services.lineage import checkpoints_index_pending

# Tasks named by a checkpoint's summary, most steps first (the count of all is given too).
SUMMARY_TASKS = 100
# Checkpoints and lease bodies read per round by the replay.
REPLAY_CHUNK = 16
# Step uids read per round by the download.
DOWNLOAD_CHUNK = 5000


# --- runs and checkpoints -----------------------------------------------------------------------
def run_get(uid: str, *, sources: Sources) -> Run | None:
    """The run ``uid`` if it is one of ``sources``' (None: any), with its consumer, dataset
    and source; else None, as for an unknown uid. One query."""
    return (
        Run.objects.select_related("consumer", "dataset", "source")
        .filter(tenancy.q("source_id", sources), uid=uid)
        .first()
    )


def runs_page(*, sources: Sources, after: int | None, limit: int) -> list[Run]:
    """Runs of ``sources``, newest first (keyset on id: ``after`` is the last id seen)."""
    qs = Run.objects.select_related("consumer", "dataset", "source").filter(tenancy.q("source_id", sources))
    if after is not None:
        qs = qs.filter(id__lt=after)
    return list(qs.order_by("-id")[:limit])


def run_checkpoints(run: Run, *, after: int | None, limit: int) -> list[Checkpoint]:
    """A run's checkpoints in version order (keyset on version), indexed (their counts and
    mean reward known). Index checkpoint_run_version_uniq."""
    checkpoints_index_pending(run_id=run.id)
    qs = Checkpoint.objects.filter(run=run)
    if after is not None:
        qs = qs.filter(version__gt=after)
    return list(qs.order_by("version")[:limit])


def checkpoint_get(run: Run, version: int) -> Checkpoint | None:
    """Checkpoint ``version`` of ``run``, indexed, or None."""
    cp = Checkpoint.objects.filter(run=run, version=version).first()
    if cp is not None and cp.indexed_at is None:
        checkpoints_index_pending(run_id=run.id)
        cp.refresh_from_db()
    return cp


def run_checkpoints_last(run: Run) -> Checkpoint | None:
    """A run's latest checkpoint, indexed, or None."""
    checkpoints_index_pending(run_id=run.id)
    return Checkpoint.objects.filter(run=run).order_by("-version").first()


def run_checkpoint_count(run: Run) -> int:
    return Checkpoint.objects.filter(run=run).count()


def unclaimed_acks(run: Run) -> int:
    """Leases the run's consumer acked for its dataset since it opened that no checkpoint
    took yet: the next checkpoint's data, so far (index lease_ack_unclaimed)."""
    return Lease.objects.filter(
        consumer_id=run.consumer_id,
        status=Lease.Status.ACKED,
        checkpoint__isnull=True,
        acked_at__gte=run.created_at,
        dataset_version__dataset_id=run.dataset_id,
    ).count()


def _steps(cp: Checkpoint, sources: Sources):
    return CheckpointStep.objects.filter(tenancy.q("source_id", sources), checkpoint=cp)


def checkpoint_summary(cp: Checkpoint, *, sources: Sources) -> dict[str, Any]:
    """What is behind a checkpoint, as ``sources`` may see it: counts of steps (served:
    a step served twice counts twice; distinct; removed since), trajectories, and the steps
    per source, per task (the SUMMARY_TASKS with most steps, and how many tasks in all), per
    dataset version; the leases in ack order; the mean reward (of every step: the
    checkpoint's own figure). A few grouped queries on the checkpoint's rows."""
    rows = _steps(cp, sources)
    total = rows.count()
    removed = rows.filter(Q(step__isnull=True) | ~Exists(Step.objects.filter(id=OuterRef("step_id")))).count()
    by_source = {
        (name if name is not None else ""): n
        for name, n in rows.values_list("source__name").annotate(n=Count("id")).order_by("source__name")
    }
    tasks = list(
        rows.filter(trajectory__group__task__isnull=False)
        .values_list("trajectory__group__task__uid")
        .annotate(n=Count("id"))
        .order_by("-n", "trajectory__group__task__uid")
    )
    versions = [
        {"dataset": name, "version": v, "steps": n}
        for name, v, n in rows.values_list(
            "lease__dataset_version__dataset__name", "lease__dataset_version__version"
        )
        .annotate(n=Count("id"))
        .order_by("lease__dataset_version__dataset__name", "lease__dataset_version__version")
    ]
    leases = list(Lease.objects.filter(checkpoint=cp).order_by("acked_at", "id").values_list("id", flat=True))
    return {
        "steps": total,
        "distinct_steps": rows.values("step_uid").distinct().count(),
        "removed_steps": removed,
        "trajectories": rows.filter(trajectory__isnull=False).values("trajectory_id").distinct().count(),
        "sources": [{"source": k or None, "steps": n} for k, n in by_source.items()],
        "tasks": [{"task": uid, "steps": n} for uid, n in tasks[:SUMMARY_TASKS]],
        "task_count": len(tasks),
        "dataset_versions": versions,
        "leases": [str(i) for i in leases],
    }


def checkpoint_steps(
    cp: Checkpoint, *, sources: Sources, after: int | None, limit: int
) -> list[dict[str, Any]]:
    """The steps behind a checkpoint in their order (keyset on position), each with its uid,
    its trajectory's uid and whether it was removed since. Index ckptstep_position_uniq."""
    qs = _steps(cp, sources).annotate(present=Exists(Step.objects.filter(id=OuterRef("step_id"))))
    if after is not None:
        qs = qs.filter(position__gt=after)
    return [
        {
            "position": pos,
            "uid": uid,
            "trajectory_uid": traj,
            "lease_id": str(lease),
            "removed": not present,
            "step_id": sid if present else None,  # the pages' link (not an API field)
        }
        for pos, uid, traj, lease, present, sid in qs.order_by("position").values_list(
            "position", "step_uid", "trajectory__uid", "lease_id", "present", "step_id"
        )[:limit]
    ]


def checkpoint_step_uids(cp: Checkpoint, *, sources: Sources) -> Iterator[str]:
    """Every step uid behind a checkpoint, in order (the download), DOWNLOAD_CHUNK per query."""
    after = -1
    while True:
        chunk = list(
            _steps(cp, sources)
            .filter(position__gt=after)
            .order_by("position")
            .values_list("position", "step_uid")[:DOWNLOAD_CHUNK]
        )
        yield from (uid for _, uid in chunk)
        if len(chunk) < DOWNLOAD_CHUNK:
            return
        after = chunk[-1][0]


def checkpoint_trajectories(
    cp: Checkpoint, *, sources: Sources, after: int | None, limit: int
) -> list[dict[str, Any]]:
    """The trajectories behind a checkpoint (keyset on trajectory id), each with its uid,
    source and how many of its steps are there."""
    qs = _steps(cp, sources).filter(trajectory__isnull=False)
    if after is not None:
        qs = qs.filter(trajectory_id__gt=after)
    return [
        {"id": tid, "uid": uid, "source": src, "steps": n}
        for tid, uid, src, n in qs.values_list("trajectory_id", "trajectory__uid", "source__name")
        .annotate(n=Count("id"))
        .order_by("trajectory_id")[:limit]
    ]


# --- the other way: what a step, a trajectory or a source trained ---------------------------------
def checkpoints_of(
    *,
    step_id: int | None = None,
    trajectory_id: int | None = None,
    source_id: int | None = None,
    runs: Sources,
    after: int | None,
    limit: int,
) -> list[Checkpoint]:
    """The checkpoints (of the runs of ``runs``' sources; None: any) whose data holds the
    step, a step of the trajectory, or a step of the source (exactly one given), oldest
    first (keyset on checkpoint id), each with ``run`` loaded and ``uses``: how many of its
    served steps those are. Indexes ckptstep_step, ckptstep_trajectory, ckptstep_source."""
    checkpoints_index_pending()
    if step_id is not None:
        of = Q(step_id=step_id)
    elif trajectory_id is not None:
        of = Q(trajectory_id=trajectory_id)
    else:
        of = Q(source_id=source_id)
    hits = CheckpointStep.objects.filter(of)
    if after is not None:
        hits = hits.filter(checkpoint_id__gt=after)
    counts = dict(
        hits.filter(checkpoint__run__in=Run.objects.filter(tenancy.q("source_id", runs)))
        .values_list("checkpoint_id")
        .annotate(n=Count("id"))
        .order_by("checkpoint_id")[:limit]
    )
    found = Checkpoint.objects.filter(id__in=list(counts)).select_related("run").order_by("id")
    out = list(found)
    for cp in out:
        cp.uses = counts[cp.id]  # type: ignore[attr-defined]
    return out


# --- two checkpoints' data ------------------------------------------------------------------
DIFF_SIDES = ("added", "removed", "common")


def checkpoints_diff_counts(a: Checkpoint, b: Checkpoint, *, sources: Sources) -> dict[str, int]:
    """How the data behind ``b`` differs from ``a``'s, by step uid: ``added`` (behind b, not
    a), ``removed`` (behind a, not b), ``common``; and each side's distinct steps."""
    ua = _steps(a, sources).values("step_uid")
    ub = _steps(b, sources).values("step_uid")
    return {
        "added": ub.exclude(step_uid__in=ua).distinct().count(),
        "removed": ua.exclude(step_uid__in=ub).distinct().count(),
        "common": ua.filter(step_uid__in=ub).distinct().count(),
        "from_steps": ua.distinct().count(),
        "to_steps": ub.distinct().count(),
    }


def checkpoints_diff_page(
    a: Checkpoint, b: Checkpoint, *, side: str, sources: Sources, after: str | None, limit: int
) -> list[str]:
    """One page of a side of the difference (DIFF_SIDES), step uids ascending (keyset on
    the uid)."""
    ua = _steps(a, sources).values("step_uid")
    ub = _steps(b, sources).values("step_uid")
    if side == "added":
        qs = _steps(b, sources).exclude(step_uid__in=ua)
    elif side == "removed":
        qs = _steps(a, sources).exclude(step_uid__in=ub)
    else:
        qs = _steps(a, sources).filter(step_uid__in=ub)
    if after is not None:
        qs = qs.filter(step_uid__gt=after)
    return list(qs.order_by("step_uid").values_list("step_uid", flat=True).distinct()[:limit])


# --- replay ------------------------------------------------------------------------------------------
def run_replay(run: Run) -> Iterator[bytes]:
    """A run as JSON lines, every batch in its order: one ``{"type": "run", ...}`` line,
    then per checkpoint (in version order) one ``{"type": "checkpoint", ...}`` line naming
    its leases in ack order, each with the steps of its batch removed from the pool since
    (``removed_steps``: named, never skipped), followed by each lease's pull answer byte for
    byte, one per line (JSON holds no raw newline). Bounded memory: REPLAY_CHUNK bodies at a
    time."""
    checkpoints_index_pending(run_id=run.id, limit=None)
    n = Checkpoint.objects.filter(run=run).count()
    yield _line(
        {
            "type": "run",
            "run": run.uid,
            "name": run.name,
            "consumer": run.consumer.name,
            "dataset": run.dataset.name,
            "policy": run.policy,
            "config": run.config,
            "code_version": run.code_version,
            "created_at": run.created_at,
            "checkpoints": n,
        }
    )
    after = None
    while True:
        page = run_checkpoints(run, after=after, limit=REPLAY_CHUNK)
        for cp in page:
            yield from _replay_checkpoint(cp)
        if len(page) < REPLAY_CHUNK:
            return
        after = page[-1].version


def _replay_checkpoint(cp: Checkpoint) -> Iterator[bytes]:
    leases = list(
        Lease.objects.filter(checkpoint=cp)
        .order_by("acked_at", "id")
        .values_list("id", "content_hash", "n_steps", "acked_at")
    )
    removed: dict[Any, list[str]] = {}
    gone = (
        CheckpointStep.objects.filter(checkpoint=cp)
        .filter(Q(step__isnull=True) | ~Exists(Step.objects.filter(id=OuterRef("step_id"))))
        .order_by("position")
        .values_list("lease_id", "step_uid")
    )
    for lease_id, uid in gone:
        removed.setdefault(lease_id, []).append(uid)
    yield _line(
        {
            "type": "checkpoint",
            "version": cp.version,
            "created_at": cp.created_at,
            "metadata": cp.metadata,
            "leases": [
                {
                    "lease_id": str(i),
                    "content_hash": h,
                    "steps": n,
                    "acked_at": at,
                    "removed_steps": removed.get(i, []),
                }
                for i, h, n, at in leases
            ],
        }
    )
    ids = [i for i, *_ in leases]
    for k in range(0, len(ids), REPLAY_CHUNK):
        bodies = dict(Lease.objects.filter(id__in=ids[k : k + REPLAY_CHUNK]).values_list("id", "body"))
        for i in ids[k : k + REPLAY_CHUNK]:
            yield bytes(bodies[i]) + b"\n"


def _line(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj) + b"\n"


def source_visible(name: str, *, sources: Sources) -> int | None:
    """The id of source ``name`` if ``sources`` (None: any) holds it, else None."""
    return Source.objects.filter(tenancy.q("id", sources), name=name).values_list("id", flat=True).first()


def step_id_visible(uid: str, *, sources: Sources) -> int | None:
    """The id of step ``uid`` if its trajectory is of ``sources`` (None: any), else None."""
    return (
        Step.objects.filter(tenancy.q("trajectory__source_id", sources), uid=uid)
        .values_list("id", flat=True)
        .first()
    )


def trajectory_id_visible(uid: str, *, sources: Sources) -> int | None:
    """The id of trajectory ``uid`` if it is of ``sources`` (None: any), else None."""
    return (
        Trajectory.objects.filter(tenancy.q("source_id", sources), uid=uid)
        .values_list("id", flat=True)
        .first()
    )


# --- trainers' verdicts ------------------------------------------------------------------------
def step_verdicts(step_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """The trainers' verdicts on these steps, oldest first, by step id: each with its lease,
    the checkpoint that took the lease (run and version; None until one does), the per-step
    statistics and the per-token rows by name. Index verdict_step."""
    out: dict[int, list[dict[str, Any]]] = {}
    rows = (
        StepVerdict.objects.filter(step_id__in=step_ids)
        .select_related("lease__checkpoint__run")
        .order_by("step_id", "id")
    )
    for v in rows:
        cp = v.lease.checkpoint
        out.setdefault(v.step_id, []).append(
            {
                "lease_id": str(v.lease_id),
                "checkpoint": {"run": cp.run.uid, "version": cp.version} if cp is not None else None,
                "importance_ratio": v.importance_ratio,
                "logprob_kl": v.logprob_kl,
                "advantage": v.advantage,
                "clipped_fraction": v.clipped_fraction,
                "tokens": verdict_tokens(v),
                "created_at": v.created_at,
            }
        )
    return out


def verdict_tokens(v: StepVerdict) -> dict[str, list[float]]:
    """A verdict's per-token rows by name (empty without any)."""
    if not v.token_fields or v.token_stats is None:
        return {}
    flat = np.frombuffer(bytes(v.token_stats), dtype="<f4")
    per = len(flat) // len(v.token_fields)
    return {
        name: flat[i * per : (i + 1) * per].astype(float).tolist() for i, name in enumerate(v.token_fields)
    }


# --- pages ---------------------------------------------------------------------------------------
def run_summary(run: Run) -> dict[str, Any]:
    """What a run trained on, over all its checkpoints: steps served, and the steps per
    source and per task (the SUMMARY_TASKS with most), for the run page. Grouped queries on
    the run's indexed rows."""
    checkpoints_index_pending(run_id=run.id)
    rows = CheckpointStep.objects.filter(checkpoint__run=run)
    sources = list(rows.values_list("source__name").annotate(n=Count("id")).order_by("-n", "source__name"))
    tasks = list(
        rows.filter(trajectory__group__task__isnull=False)
        .values_list("trajectory__group__task__uid")
        .annotate(n=Count("id"))
        .order_by("-n", "trajectory__group__task__uid")
    )
    return {
        "steps": rows.count(),
        "sources": [{"source": name, "steps": n} for name, n in sources],
        "tasks": [{"task": uid, "steps": n} for uid, n in tasks[:SUMMARY_TASKS]],
        "task_count": len(tasks),
    }


def snapshot_previous(snap: Snapshot) -> Snapshot | None:
    """The done snapshot of the same dataset made just before ``snap`` (what its diff page
    compares with by default), or None."""
    return (
        Snapshot.objects.filter(
            dataset_version__dataset_id=snap.dataset_version.dataset_id,
            status=Snapshot.Status.DONE,
            created_at__lt=snap.created_at,
        )
        .order_by("-created_at")
        .first()
    )
