"""Lineage: training runs, their checkpoints, and the data behind each checkpoint.

A trainer opens a run (``run_open``, ``POST /api/v1/runs``): the consumer it pulls as, the
dataset it reads, its config and code version. Each policy version it then publishes with
the run's uid (``POST /api/v1/policy-versions`` with ``"run"``) is a checkpoint of the run
(``checkpoint_record``, the effect of the pool's ``PolicyPublished``, in the publication's
transaction). A checkpoint takes, in one UPDATE, the leases its run's consumer acked for the
run's dataset since the run opened that no checkpoint took yet (``Lease.checkpoint``): the
acks since the run's previous checkpoint, in ack order. An acked lease is taken by exactly
one checkpoint (the UPDATE only takes leases no checkpoint holds, under their row locks); a
nacked or expired lease is never acked, so never taken; an ack that commits after a
checkpoint's UPDATE goes to the next one. Neither a pull nor an ack does any lineage work
(their statements are as they were); a checkpoint costs its row and that UPDATE.

The steps behind a checkpoint are indexed afterwards, from the leases' manifests
(``checkpoint_index``: ``CheckpointStep`` rows, in ack order then each batch's order), by the
periodic sweep (task ``curation.checkpoints_index``) or by the first read that needs them
(curation/selectors/lineage.py calls ``checkpoints_index_pending`` first). Indexing is
idempotent, so both may run.

Tenancy: a run is its consumer's source's (``Run.source``). A key opens runs for its own
source's consumers, publishes checkpoints of its write sources' runs, and reads its read
sources' runs (pool/tenancy.py); another source's run answers like an unknown uid.
"""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Any

import msgspec
import orjson
from django.db import IntegrityError, transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from claw_kit.web import guard
from pool import tenancy
from pool.bus import PolicyPublished
from pool.errors import Conflict, InvalidInput, NotFound, UidTaken
from pool.models import Step
from pool.services.policy import policy_check_name

from ..models import Checkpoint, CheckpointStep, Dataset, DatasetVersion, Lease, Run
from ..specs import struct_parse
from .consume import Actor, _consumer

# A run uid travels in URL paths: letters, digits and ``.``, ``_``, ``:``, ``-``.
_RUN_UID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_NAME = 128
MAX_CODE_VERSION = 128
# Leases read per round when indexing a checkpoint (their bodies are whole batches: a few
# MB at most each), and step uids resolved per statement.
LEASE_CHUNK = 16
UID_CHUNK = 2000
# CheckpointStep rows per INSERT.
ROW_CHUNK = 2000
# Checkpoints a reader indexes before answering, at most (the sweep does the rest).
INDEX_ON_READ = 200


class RunIn(msgspec.Struct, forbid_unknown_fields=True):
    """What ``POST /api/v1/runs`` takes: the run contract (the API parses with it, its schema is
    derived from it, ``run_validate`` checks what a type cannot say)."""

    consumer: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    dataset: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    name: Annotated[str, msgspec.Meta(max_length=MAX_NAME)] = ""
    config: dict[str, Any] | None = None
    code_version: Annotated[str, msgspec.Meta(max_length=MAX_CODE_VERSION)] = ""
    policy: Annotated[str, msgspec.Meta(description='default: "default"')] = "default"
    uid: (
        Annotated[
            str,
            msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,128}$", description="idempotency: minted when absent"),
        ]
        | None
    ) = None


def run_parse(raw: Any) -> RunIn:
    """A run's JSON body as a RunIn (run_open checks the rest), or InvalidInput naming the field."""
    return struct_parse(raw, RunIn)


def run_validate(r: RunIn) -> None:
    """InvalidInput naming the first bad field of a run to open (built in code: its
    constructor checks no bound)."""
    struct_parse(msgspec.structs.asdict(r), RunIn)
    _text(r.consumer, "consumer", 64, required=True)
    _text(r.dataset, "dataset", 64, required=True)
    _text(r.name, "name", MAX_NAME)
    _text(r.code_version, "code_version", MAX_CODE_VERSION)
    if r.uid is not None and (not isinstance(r.uid, str) or not _RUN_UID.fullmatch(r.uid)):
        raise InvalidInput("a run uid is 1-128 letters, digits, '.', '_', ':' or '-'", field="uid")
    if r.config is not None and not isinstance(r.config, dict):
        raise InvalidInput("config must be a JSON object", field="config")
    policy_check_name(r.policy, field="policy")


def run_open(*, run: RunIn, actor: Actor | None = None) -> tuple[Run, bool]:
    """Open a training run for ``actor``'s source's consumer ``run.consumer`` (created on
    first sight, as a first pull would) on dataset ``run.dataset``; returns (run, created).
    Idempotent by ``run.uid`` (minted when none is given): the same uid of the same source
    for the same consumer and dataset answers the run it opened; another source's uid is
    UidTaken, the same uid for another consumer or dataset a Conflict naming ``uid``.
    InvalidInput or NotFound naming the field; nothing is written when it raises."""
    run_validate(run)
    ds = Dataset.objects.filter(name=run.dataset).only("id").first()
    if ds is None:
        raise NotFound(f"dataset {run.dataset!r} does not exist", field="dataset")
    who = _consumer(run.consumer, actor)
    uid = run.uid if run.uid is not None else f"run-{uuid.uuid4().hex}"
    existing = Run.objects.filter(uid=uid).first()
    if existing is None:
        try:
            with transaction.atomic():
                return (
                    Run.objects.create(
                        uid=uid,
                        name=run.name or "",
                        consumer=who,
                        dataset=ds,
                        source_id=who.source_id,
                        policy=run.policy,
                        config=run.config or {},
                        code_version=run.code_version or "",
                        created_at=timezone.now(),
                    ),
                    True,
                )
        except IntegrityError:  # a concurrent open of the same uid won
            existing = Run.objects.get(uid=uid)
    if actor is not None and not actor.owns(existing.source_id):
        raise UidTaken("run", uid, field="uid")
    if existing.consumer_id != who.id:
        raise Conflict(f"run {uid!r} was opened for another consumer", field="uid")
    if existing.dataset_id != ds.id:
        raise Conflict(f"run {uid!r} was opened on another dataset", field="uid")
    return existing, False


def checkpoint_record(event: PolicyPublished) -> None:
    """The effect of ``PolicyPublished`` (curation/apps.py): record version ``event.version``
    as a checkpoint of run ``event.run`` and take its data, in the publication's
    transaction; says what it recorded in ``event.recorded``. A run the caller may not see
    is left alone (the pool answers 404 naming ``run``). Idempotent for the run's last
    checkpoint (a retried publication takes nothing more); a version below it is a
    Conflict naming ``version``, another policy than the run's an InvalidInput naming
    ``policy``. Three statements: the run (locked: a run's checkpoints are recorded one at a
    time), its last checkpoint, the new row, and the one UPDATE taking the leases."""
    run = (
        Run.objects.select_for_update()
        .filter(tenancy.q("source_id", event.sources), uid=event.run)
        .only("id", "uid", "consumer_id", "dataset_id", "policy", "created_at")
        .first()
    )
    if run is None:
        return
    if run.policy != event.policy:
        raise InvalidInput(
            f"run {run.uid!r} publishes versions of policy {run.policy!r}, not {event.policy!r}",
            field="policy",
        )
    last = Checkpoint.objects.filter(run=run).order_by("-version").first()
    if last is not None and event.version <= last.version:
        if event.version < last.version:
            raise Conflict(
                f"run {run.uid!r} has checkpoint {last.version}: a checkpoint's version must be above it",
                field="version",
            )
        event.recorded.update(checkpoint_answer(run, last, leases=_leases_of(last)))
        return
    cp = Checkpoint.objects.create(
        run=run, version=event.version, metadata=event.metadata or {}, created_at=timezone.now()
    )
    taken = Lease.objects.filter(
        consumer_id=run.consumer_id,
        status=Lease.Status.ACKED,
        checkpoint__isnull=True,
        acked_at__gte=run.created_at,
        dataset_version_id__in=DatasetVersion.objects.filter(dataset_id=run.dataset_id).values("id"),
    ).update(checkpoint=cp)
    event.recorded.update(checkpoint_answer(run, cp, leases=taken))


def checkpoint_answer(run: Run, cp: Checkpoint, *, leases: int) -> dict[str, Any]:
    """The ``checkpoint`` of a publication's answer."""
    return {"run": run.uid, "version": cp.version, "leases": leases, "created_at": cp.created_at}


def _leases_of(cp: Checkpoint) -> int:
    return cp.n_leases if cp.n_leases is not None else Lease.objects.filter(checkpoint=cp).count()


def checkpoint_index(*, checkpoint_id: int) -> Checkpoint | None:
    """Index the steps behind a checkpoint from its leases' manifests: a ``CheckpointStep``
    per served step (ack order of the leases, then batch order; uids resolved to the
    steps still stored, a removed one kept by uid alone), and the checkpoint's counts and
    mean reward. Idempotent: an indexed checkpoint is returned as it is; two indexers of one
    checkpoint take turns on its row lock. None when the checkpoint is gone. Bounded
    memory: LEASE_CHUNK bodies and ROW_CHUNK rows at a time."""
    with transaction.atomic():
        cp = Checkpoint.objects.select_for_update().filter(id=checkpoint_id).first()
        if cp is None or cp.indexed_at is not None:
            return cp
        leases = (
            Lease.objects.filter(checkpoint=cp)
            .order_by("acked_at", "id")
            .values_list("id", "body")
            .iterator(chunk_size=LEASE_CHUNK)
        )
        position = n_leases = 0
        rewards: list[float] = []
        rows: list[CheckpointStep] = []
        for lease_id, body in leases:
            n_leases += 1
            uids = _manifest(body).get("step_uids") or []
            for i in range(0, len(uids), UID_CHUNK):
                chunk = uids[i : i + UID_CHUNK]
                known = {
                    uid: (sid, tid, src, reward)
                    for uid, sid, tid, src, reward in Step.objects.filter(uid__in=chunk).values_list(
                        "uid",
                        "id",
                        "trajectory_id",
                        "trajectory__source_id",
                        Coalesce(F("effective_reward"), F("reward")),
                    )
                }
                for uid in chunk:
                    sid, tid, src, reward = known.get(uid, (None, None, None, None))
                    rows.append(
                        CheckpointStep(
                            checkpoint=cp,
                            position=position,
                            lease_id=lease_id,
                            step_id=sid,
                            step_uid=uid,
                            trajectory_id=tid,
                            source_id=src,
                        )
                    )
                    position += 1
                    if reward is not None:
                        rewards.append(reward)
                if len(rows) >= ROW_CHUNK:
                    CheckpointStep.objects.bulk_create(rows, batch_size=ROW_CHUNK, ignore_conflicts=True)
                    rows = []
        if rows:
            CheckpointStep.objects.bulk_create(rows, batch_size=ROW_CHUNK, ignore_conflicts=True)
        cp.indexed_at = timezone.now()
        cp.n_leases, cp.n_steps = n_leases, position
        cp.reward_mean = sum(rewards) / len(rewards) if rewards else None
        cp.save(update_fields=["indexed_at", "n_leases", "n_steps", "reward_mean"])
        return cp


def checkpoints_index_pending(*, run_id: int | None = None, limit: int | None = INDEX_ON_READ) -> int:
    """Index the checkpoints not indexed yet (a run's, or every run's), oldest first, at
    most ``limit`` (None: all); returns how many were indexed. Idempotent; what the
    sweep and the readers call. One query when there is nothing to do (index
    checkpoint_unindexed)."""
    pending = Checkpoint.objects.filter(indexed_at__isnull=True)
    if run_id is not None:
        pending = pending.filter(run_id=run_id)
    ids = list(pending.order_by("id").values_list("id", flat=True)[:limit])
    for cid in ids:
        checkpoint_index(checkpoint_id=cid)
    return len(ids)


def _manifest(body: bytes | memoryview) -> dict[str, Any]:
    """The manifest of a lease's stored body (its pull answer, byte for byte)."""
    return orjson.loads(bytes(body)).get("manifest") or {}


def _text(value: Any, field: str, limit: int, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or len(value) > limit or (required and not value):
        raise InvalidInput(
            f"{field} must be a string of {'1' if required else '0'}-{limit} characters", field=field
        )
    if value and (problem := guard.ident_problem(value) if required else guard.chars_problem(value)):
        raise InvalidInput(f"{field} {problem}", field=field)
