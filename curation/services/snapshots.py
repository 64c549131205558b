"""Snapshots: a dataset version's admitted steps frozen into JSONL and Parquet files.

``snapshot_create`` records the request and emits ``SnapshotRequested``, whose effect
(curation/tasks.py) enqueues ``curation.snapshot_build`` on commit; every status change is a
``SnapshotChanged``, whose effect is the live ``snapshot`` event (curation/events.py).
The build freezes the admitted step ids at its first attempt, then writes both files in
bounded chunks (keyset over the frozen ids) to local temporary files, stores them under a
per-attempt folder and, last, records the file names and marks the snapshot done in one
conditional UPDATE. A build that dies at any point leaves no recorded file; the next attempt
removes the leftovers and rebuilds from scratch, with the same content (same hash).
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import math
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Annotated, Any, Literal

import msgspec
import orjson
from django.conf import settings
from django.core.files import File
from django.core.files.storage import default_storage
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from claw_client.integrations import trl
from pool import tokens
from pool.bus import emit
from pool.errors import InvalidInput, NotFound
from pool.lookups import Many
from pool.media import media_file
from pool.models import Feedback, Media, Step, Trajectory
from pool.replica import replica_caught_up, replica_reads
from pool.selectors.steps import steps_read
from pool.services import effective_reward
from pool.services.delivery import trajectories_delivered_mark

from ..events import SnapshotChanged, SnapshotRequested
from ..models import Dataset, Snapshot, StepTag
from ..selectors.specs import dataset_admitted
from ..snapshot_files import registry
from ..snapshot_files.base import Chunk, media_name
from ..snapshot_files.jsonl import JsonlFile
from ..snapshot_files.parquet import ParquetFile
from ..snapshot_files.tar import TarFile
from ..specs import Grouping, spec_parse, struct_parse

# TRL exports a snapshot may also hold (``format`` at creation; claw_client.integrations.trl):
# a JSONL file of conversational SFT rows or of preference pairs, built from the rollouts'
# final admitted steps. Their options are kept in the manifest's ``export``.
EXPORTS = ("sft", "dpo")
# Steps read, rendered and written per chunk: settings.CLAW_SNAPSHOT_CHUNK_STEPS (default
# 1,000). 1,000 steps of ~2k tokens: ~60 ms of reads and rendering and ~20 MB of rows in
# memory; progress is recorded after each chunk.
ROOT = "snapshots"
log = logging.getLogger(__name__)
# What a snapshot may be downloaded as: its files (curation/snapshot_files/registry.py) and
# its TRL export, by name.
CONTENT_TYPES = {**registry.CONTENT_TYPES, **dict.fromkeys(EXPORTS, "application/x-ndjson")}


class SnapshotIn(msgspec.Struct, forbid_unknown_fields=True):
    """What ``POST /api/v1/snapshots`` takes: the snapshot request contract (the API parses with
    it, its schema is derived from it; ``snapshot_create`` checks the export's options)."""

    dataset: Annotated[
        str, msgspec.Meta(min_length=1, description="the dataset's name; its current version is frozen")
    ]
    format: (
        Annotated[
            Literal["sft", "dpo"],
            msgspec.Meta(
                description="also write this TRL export (claw_client.integrations.trl), downloadable as ?format="
            ),
        ]
        | None
    ) = None
    min_reward: (
        Annotated[
            float,
            msgspec.Meta(
                description="sft: every rollout with at least this reward (default: the best per group)"
            ),
        ]
        | None
    ) = None
    margin: (
        Annotated[
            float, msgspec.Meta(ge=0, description="dpo: the least reward difference of a pair (default 0)")
        ]
        | None
    ) = None


def snapshot_parse(raw: Any) -> SnapshotIn:
    """A snapshot request's JSON body as a SnapshotIn, or InvalidInput naming the field."""
    return struct_parse(raw, SnapshotIn)


def snapshot_create(
    *,
    dataset: str,
    actor: str = "",
    format: str | None = None,
    min_reward: float | None = None,
    margin: float | None = None,
) -> Snapshot:
    """Request a snapshot of ``dataset``'s current version; the build runs after commit.
    Not idempotent (each call is a new snapshot). ``format`` ``sft`` (with an optional
    ``min_reward``) or ``dpo`` (with an optional ``margin``, default 0) adds that TRL export.
    Raises InvalidInput/NotFound naming the field."""
    if not isinstance(dataset, str) or not dataset:
        raise InvalidInput("dataset: the name of a dataset", field="dataset")
    export = _export_of(format, min_reward, margin)
    ds = Dataset.objects.select_related("current").filter(name=dataset).first()
    if ds is None or ds.current is None:
        raise NotFound(f"dataset {dataset!r} does not exist", field="dataset")
    with transaction.atomic():
        snap = Snapshot.objects.create(
            id=uuid.uuid4(),
            dataset_version=ds.current,
            created_by=actor,
            manifest={"export": export} if export else {},
        )
        # Published first: in embedded mode the build runs in the enqueue's on-commit
        # callback, so a "pending" registered after it would follow (and undo) its "done".
        snapshot_changed(snap.id, Snapshot.Status.PENDING, 0, None)
        emit(SnapshotRequested(snapshot_id=str(snap.id)))  # its build: curation/tasks.py
    return snap


def snapshot_build(
    *,
    snapshot_id: uuid.UUID | str,
    chunk_size: int | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> Snapshot | None:
    """Build a snapshot's files. Idempotent: a done snapshot is returned as is, a vanished
    one gives None; otherwise it is rebuilt from scratch (the admitted ids frozen at the
    first attempt), and only a complete build is recorded. On an error the attempt's files
    are removed, the snapshot is marked failed with the error, and the error is raised (a
    later call rebuilds). ``chunk_size`` defaults to settings.CLAW_SNAPSHOT_CHUNK_STEPS;
    ``on_chunk(n)`` runs after chunk n is written (tests)."""
    snap = _attempt_start(snapshot_id)
    if snap is None or snap.status == Snapshot.Status.DONE:
        return snap
    folder = f"{ROOT}/{snap.id}/{snap.attempt}"
    _remove_stale(snap)
    stored: list[str] = []
    try:
        size = chunk_size or settings.CLAW_SNAPSHOT_CHUNK_STEPS
        files, manifest, source_ids = _write(snap, folder, stored, size, on_chunk)
    except BaseException as exc:
        _attempt_fail(snap, stored, exc)
        raise
    with transaction.atomic():
        won = (
            Snapshot.objects.filter(id=snap.id, attempt=snap.attempt)
            .exclude(status=Snapshot.Status.DONE)
            .update(
                status=Snapshot.Status.DONE,
                files=files,
                manifest=manifest,
                source_ids=source_ids,
                content_hash=manifest["content_hash"],
                steps_done=manifest["steps"],
                error="",
                updated_at=timezone.now(),
            )
        )
    if not won:  # a newer attempt owns the snapshot (a redelivered task): ours is void
        _remove(stored)
        log.info("snapshot %s: attempt %s superseded by a newer one", snap.id, snap.attempt)
    else:
        snapshot_changed(snap.id, Snapshot.Status.DONE, manifest["steps"], manifest["steps"])
        log.info("snapshot %s: done by attempt %s, %d steps", snap.id, snap.attempt, manifest["steps"])
    return Snapshot.objects.get(id=snap.id)


def snapshot_changed(snapshot_id: uuid.UUID, status: str, steps: int, total: int | None) -> None:
    """Emit ``SnapshotChanged`` (its effect: the live ``snapshot`` event, curation/events.py)."""
    emit(SnapshotChanged(snapshot_id=str(snapshot_id), status=status, steps=steps, total=total))


# --- helpers --------------------------------------------------------------------------------
def _export_of(format: Any, min_reward: Any, margin: Any) -> dict[str, Any] | None:
    """The TRL export asked for, as kept in the manifest (None: none)."""
    if format is None:
        for name, value in (("min_reward", min_reward), ("margin", margin)):
            if value is not None:
                raise InvalidInput(
                    f"{name} needs format {'sft' if name == 'min_reward' else 'dpo'}", field=name
                )
        return None
    if format not in EXPORTS:
        raise InvalidInput(f"format must be one of {list(EXPORTS)} (or absent)", field="format")
    own, other = ("min_reward", "margin") if format == "sft" else ("margin", "min_reward")
    if (min_reward if other == "min_reward" else margin) is not None:
        raise InvalidInput(f"{other} does not apply to format {format}", field=other)
    value = min_reward if own == "min_reward" else margin
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
    ):
        raise InvalidInput(f"{own} must be a finite number", field=own)
    if own == "margin":
        if value is not None and value < 0:
            raise InvalidInput("margin must be >= 0", field="margin")
        return {"format": "dpo", "margin": float(value) if value is not None else 0.0}
    return {"format": "sft", "min_reward": float(value) if value is not None else None}


def _attempt_start(snapshot_id) -> Snapshot | None:
    """Lock the snapshot, freeze its step ids if not yet, and take the build over."""
    with transaction.atomic():
        snap = (
            Snapshot.objects.select_for_update()
            .select_related("dataset_version__dataset")
            .filter(id=snapshot_id)
            .first()
        )
        if snap is None or snap.status == Snapshot.Status.DONE:
            return snap
        if snap.step_ids is None:
            admitted = dataset_admitted(spec_parse(snap.dataset_version.spec))
            # Frozen into a snapshot: their trajectories' rewards are frozen too, and what a
            # retention pass removed since they were read is left out (its lock came first).
            snap.step_ids = sorted(trajectories_delivered_mark(step_ids=admitted))
            snap.masked_ids = [i for i in snap.step_ids if admitted[i]]
            snap.steps_total = len(snap.step_ids)
        snap.attempt = uuid.uuid4().hex
        snap.status, snap.steps_done, snap.error = Snapshot.Status.BUILDING, 0, ""
        snap.save()
        snapshot_changed(snap.id, snap.status, 0, snap.steps_total)
    log.info("snapshot %s: attempt %s started, %d steps", snap.id, snap.attempt, snap.steps_total)
    return snap


def _attempt_fail(snap: Snapshot, stored: list[str], exc: BaseException) -> None:
    """Best effort (the database or the storage may be what failed): remove this attempt's
    files and record the error. Whatever is left is removed by the next attempt."""
    try:
        _remove(stored)
        Snapshot.objects.filter(id=snap.id, attempt=snap.attempt).exclude(status=Snapshot.Status.DONE).update(
            status=Snapshot.Status.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            updated_at=timezone.now(),
        )
        snapshot_changed(snap.id, Snapshot.Status.FAILED, 0, snap.steps_total)
    except Exception:  # noqa: BLE001 - the original error is the one raised
        log.exception("snapshot %s: could not record the failed attempt", snap.id)


def _remove_stale(snap: Snapshot) -> None:
    """Remove the folders of earlier attempts (killed builds) of this snapshot."""
    base = f"{ROOT}/{snap.id}"
    try:
        folders, _ = default_storage.listdir(base)
    except FileNotFoundError:
        return
    for folder in folders:
        if folder != snap.attempt:
            _remove([f"{base}/{folder}/{name}" for name in default_storage.listdir(f"{base}/{folder}")[1]])


def _remove(names: list[str]) -> None:
    for name in names:
        default_storage.delete(name)


def _write(
    snap: Snapshot, folder: str, stored: list[str], chunk_size: int, on_chunk: Callable[[int], None] | None
) -> tuple[dict[str, str], dict[str, Any], list[int | None]]:
    """Write both files chunk by chunk to local temporary files, then store them. Returns
    the files, the manifest and the source ids of the steps' trajectories (Snapshot.source_ids).

    The temporary files have no name (tempfile.TemporaryFile: unlinked at creation on
    POSIX), so a build killed mid-way leaves nothing on the worker's disk: the kernel frees
    them with the process. Everything reads and writes them through their handles."""
    masked = set(snap.masked_ids or [])
    stats = _Stats()
    export = (snap.manifest or {}).get("export")
    finals = _Finals() if export else None
    sources: set[int | None] = set()
    with ExitStack() as stack:
        tmps = {f.name: stack.enter_context(tempfile.TemporaryFile()) for f in registry.FILES}
        writers = [f(tmps[f.name]) for f in registry.FILES]
        parquet = next(w for w in writers if isinstance(w, ParquetFile))
        stack.callback(parquet.close)  # a failed build closes its writer too
        chunks = _chunks(snap.step_ids or [], masked, chunk_size, _assignment(snap))
        # Read from the replica once it has replayed the frozen ids (pool/replica.py); a
        # replica still behind after the wait (or none) leaves the reads on the primary.
        if replica_caught_up(timeout=settings.CLAW_REPLICA_WAIT_SECONDS):
            chunks = _on_replica(chunks)
        for n, chunk in enumerate(chunks, start=1):
            for w in writers:
                w.add(chunk)
            for row in chunk.rows:
                stats.add(row)
            sources |= chunk.source_ids
            if finals is not None:
                finals.add(chunk)
            Snapshot.objects.filter(id=snap.id, attempt=snap.attempt).update(
                steps_done=stats.steps, updated_at=timezone.now()
            )
            snapshot_changed(snap.id, Snapshot.Status.BUILDING, stats.steps, snap.steps_total)
            if on_chunk is not None:
                on_chunk(n)
        files = {}
        # Each writer completes its file (the tar adds the JSONL last), then each is stored.
        kept = [w for w in writers if w.finish(tmps)]
        for w in kept:
            tmp = tmps[w.name]
            tmp.flush()
            tmp.seek(0)
            name = default_storage.save(f"{folder}/snapshot.{w.name}", File(tmp, name=f"snapshot.{w.name}"))
            stored.append(name)
            files[w.name] = name
        jsonl = next(w for w in writers if isinstance(w, JsonlFile))
        tar = next(w for w in writers if isinstance(w, TarFile))
    if finals is not None:
        export = {**export, **_write_export(export, finals, folder, stored, files)}
    version = snap.dataset_version
    manifest = {
        "snapshot_id": str(snap.id),
        "dataset": version.dataset.name,
        "dataset_version": version.version,
        "spec": version.spec,
        **stats.summary(),
        "media": tar.summary(),
        "content_hash": jsonl.digest.hexdigest(),
        **({"export": export} if export else {}),
        "formats": {fmt: {"bytes": default_storage.size(name)} for fmt, name in files.items()},
        "created_at": snap.created_at.isoformat(),
        "built_at": timezone.now().isoformat(),
    }
    return files, manifest, sorted(sources, key=lambda i: (i is None, i or 0))


def _write_export(
    export: dict[str, Any], finals: _Finals, folder: str, stored: list[str], files: dict[str, str]
) -> dict[str, Any]:
    """Write the TRL export file (one JSON object per line) and record it in ``files``;
    returns its row count and sha256 for the manifest."""
    steps = finals.steps()
    if export["format"] == "sft":
        rows = trl.to_sft_rows(steps, min_reward=export["min_reward"])
    else:
        rows = trl.to_dpo_pairs(steps, margin=export["margin"])
    digest = hashlib.sha256()
    with tempfile.TemporaryFile() as tmp:
        for row in rows:
            line = orjson.dumps(row) + b"\n"
            tmp.write(line)
            digest.update(line)
        tmp.flush()
        tmp.seek(0)
        fmt = export["format"]
        name = default_storage.save(f"{folder}/snapshot.{fmt}.jsonl", File(tmp, name=f"snapshot.{fmt}.jsonl"))
    stored.append(name)
    files[fmt] = name
    return {"rows": len(rows), "sha256": digest.hexdigest()}


class _Finals:
    """The final frozen step of each rollout (trajectory and branch: the highest step_index),
    collected chunk by chunk; ``steps()`` reads their chat messages and reply (one query per
    1,000 rollouts) as ``steps``-format rows for claw_client.integrations.trl."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, int], tuple[int, int, dict[str, Any]]] = {}

    def add(self, chunk: Chunk) -> None:
        for sid, branch, row in zip(chunk.ids, chunk.branches, chunk.rows, strict=True):
            key = (row["trajectory_uid"], branch)
            seen = self.last.get(key)
            if seen is None or row["step_index"] > seen[0]:
                self.last[key] = (row["step_index"], sid, {**row, "branch": branch})

    def steps(self) -> list[dict[str, Any]]:
        by_id = {sid: row for _, sid, row in self.last.values()}
        ids = sorted(by_id)
        out = []
        for start in range(0, len(ids), 1000):
            part = ids[start : start + 1000]
            texts = {
                sid: (messages, text)
                for sid, messages, text in Step.objects.filter(id__in=part).values_list(
                    "id", "messages", "response_text"
                )
            }
            for sid in part:
                row = by_id[sid]
                messages, text = texts[sid]
                out.append(
                    {
                        "trajectory_uid": row["trajectory_uid"],
                        "branch": row["branch"],
                        "prompt_group_uid": row["prompt_group_uid"],
                        "step_index": row["step_index"],
                        "reward": row["reward"],
                        "mask": row["mask"],
                        "metadata": row["metadata"],
                        "messages": messages,
                        "response_text": text,
                    }
                )
        return out


def _assignment(snap: Snapshot) -> Grouping:
    """The snapshot's dataset version's grouping (its ``reward_assignment`` and ``gamma``)."""
    return spec_parse(snap.dataset_version.spec).grouping


def _on_replica(chunks: Iterator[Chunk]) -> Iterator[Chunk]:
    """``chunks``, each read inside ``replica_reads()`` (the writes between them, progress
    and files, stay on the primary)."""
    while True:
        with replica_reads():
            chunk = next(chunks, None)
        if chunk is None:
            return
        yield chunk


def _chunks(step_ids: list[int], masked: set[int], size: int, assignment: Grouping) -> Iterator[Chunk]:
    """The frozen steps, ``size`` at a time in id order (keyset: id > the last), each row
    read by the one step reader (pool.selectors.steps.steps_read, without the texts) and
    given what a snapshot adds: its tags, its feedback, its mask, the per-token policy
    versions expanded, the images' file names and the dataset's reward assignment."""
    last = 0
    while True:
        start = bisect.bisect_right(step_ids, last)  # the first id after the last chunk's
        ids = step_ids[start : start + size]
        if not ids:
            return
        read = steps_read(ids, texts=False)
        if len(read.ids) != len(ids):
            gone = sorted(set(ids) - set(read.ids))
            raise NotFound(
                f"step id {gone[0]} was deleted after the snapshot was requested", field="snapshot"
            )
        tags: dict[int, list[str]] = {}
        for sid, tag in (
            StepTag.objects.filter(step_id__any=Many(ids))
            .order_by("step_id", "tag")
            .values_list("step_id", "tag")
        ):
            tags.setdefault(sid, []).append(tag)
        trajs = set(read.trajectory_ids)
        feedback: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for f in (
            Feedback.objects.filter(
                Q(step_id__any=Many(ids)) | Q(trajectory_id__any=Many(trajs), step__isnull=True)
            )
            .order_by("id")
            .values("step_id", "trajectory_id", "rating", "label", "correction", "comment")
        ):
            sid, tid = f.pop("step_id"), f.pop("trajectory_id")
            feedback.setdefault(("s", sid) if sid is not None else ("t", tid), []).append(f)
        chunk = Chunk()
        chunk.source_ids = set(
            Trajectory.objects.filter(id__any=Many(sorted(trajs)))
            .values_list("source_id", flat=True)
            .distinct()
        )
        chunk.media = _media_bytes({sid: r["images"] for sid, r in zip(read.ids, read.rows, strict=True)})
        chunk.ids, chunk.branches = read.ids, read.branches
        chunk.prompts, chunk.responses = read.prompts, read.responses
        chunk.logprobs, chunk.token_rewards = read.logprobs, read.token_rewards
        for sid, traj_id, r in zip(read.ids, read.trajectory_ids, read.rows, strict=True):
            runs = r["token_policy_versions"]
            versions = tokens.runs_expand(runs) if runs is not None else None
            chunk.token_versions.append(
                versions.astype(tokens.VERSION_DTYPE).tobytes() if versions is not None else None
            )
            chunk.rows.append(
                {
                    "uid": r["uid"],
                    "trajectory_uid": r["trajectory_uid"],
                    "prompt_group_uid": r["prompt_group_uid"],
                    "step_index": r["step_index"],
                    "prompt_ids": r["prompt_ids"],
                    "response_ids": r["response_ids"],
                    "rollout_logprobs": r["rollout_logprobs"],
                    "token_rewards": r["token_rewards"],
                    "token_versions": versions,
                    # The effective reward (pool/services/effective_reward.py), reassigned
                    # below by the dataset's reward assignment.
                    "reward": r["reward"],
                    "reward_source": r["reward_source"],
                    "reward_scope": r["reward_scope"],
                    "outcome_reward": r["outcome_reward"],
                    "process_reward": r["process_reward"],
                    "policy_version": r["policy_version"],
                    "token_source": r["token_source"],
                    "drift": r["drift"],
                    "quality_flags": r["quality_flags"],
                    "readiness": r["readiness"],
                    "label": r["label"],
                    "tags": tags.get(sid, []),
                    # The step's own feedback, then its trajectory's, each oldest first.
                    "feedback": feedback.get(("s", sid), []) + feedback.get(("t", traj_id), []),
                    "mask": sid in masked,
                    "metadata": r["metadata"],
                    "images": [_image_ref(i) for i in r["images"]],
                }
            )
        effective_reward.assign(
            chunk.rows,
            mode=assignment.reward_assignment,
            gamma=assignment.gamma,
            trajectory_ids=trajs,
            branches=chunk.branches,
        )
        yield chunk
        last = ids[-1]


# --- images (issue 24) ----------------------------------------------------------------------
def _image_ref(image: dict[str, Any]) -> dict[str, Any]:
    """A step's image as a snapshot row holds it: the reads' reference (sha256, type, size,
    place in the prompt; ``url`` the API download) plus ``file``, its path in the tar
    (``media/<sha256>.<ext>``; null for a remote image, whose ``url`` is its address)."""
    ref = dict(image)
    ref["file"] = f"media/{media_name(image['sha256'], image['media_type'])}" if image["sha256"] else None
    return ref


def _media_bytes(images: dict[int, list[dict[str, Any]]]) -> dict[str, bytes]:
    """The stored bytes of every image these steps reference, each read once."""
    shas = {i["sha256"] for refs in images.values() for i in refs if i["sha256"]}
    if not shas:
        return {}
    out = {}
    for m in Media.objects.filter(sha256__in=shas).order_by("sha256"):
        with media_file(m) as fh:
            out[m.sha256] = fh.read()
    return out


class _Stats:
    """Counts, token statistics and the policy-version histogram, accumulated per row."""

    def __init__(self) -> None:
        self.steps = self.masked = self.prompt_tokens = self.response_tokens = 0
        self.trajectories: set[str] = set()
        self.groups: set[str] = set()
        self.versions: Counter[int | None] = Counter()

    def add(self, row: dict[str, Any]) -> None:
        self.steps += 1
        self.masked += row["mask"]
        self.prompt_tokens += len(row["prompt_ids"])
        self.response_tokens += len(row["response_ids"])
        self.trajectories.add(row["trajectory_uid"])
        if row["prompt_group_uid"] is not None:
            self.groups.add(row["prompt_group_uid"])
        self.versions[row["policy_version"]] += 1

    def summary(self) -> dict[str, Any]:
        n = self.steps or 1
        return {
            "steps": self.steps,
            "masked_steps": self.masked,
            "trajectories": len(self.trajectories),
            "groups": len(self.groups),
            "prompt_tokens": self.prompt_tokens,
            "response_tokens": self.response_tokens,
            "mean_prompt_tokens": self.prompt_tokens / n,
            "mean_response_tokens": self.response_tokens / n,
            # Steps per policy version; steps without one apart, never under a "None" key.
            "policy_versions": {
                str(v): self.versions[v] for v in sorted(v for v in self.versions if v is not None)
            },
            "steps_without_policy_version": self.versions.get(None, 0),
        }
