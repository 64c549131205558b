"""Consumption: trainers pull batches of what a dataset admits, under leases.

A pull claims units (whole prompt groups, lone trajectories, or steps) for one consumer by
inserting ``Delivery`` rows, unique per (consumer, dataset, unit): concurrent pullers of one
consumer can never both claim a unit, on PostgreSQL or SQLite, and a unit lost to another
puller is simply replaced by the next candidate. Ready units are offered oldest-ready first;
a unit that is not ready is never a candidate, so it blocks nothing.

A lease ends by ack (its units are consumed by that consumer for good), nack or expiry (its
Delivery rows go, the units are candidates again). The batch is stored byte for byte with
its manifest, so ``GET /api/v1/leases/{id}/batch`` replays exactly what was trained on.

A consumer belongs to the source of the key that created it (``Actor``): another source's
keys get NotFound for it and for its leases; admins (admin keys, operators) act on all.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from claw_kit.web import guard
from claw_kit.web.renderers import dumps
from pool import sql
from pool.errors import Conflict, InvalidInput, NotFound
from pool.ingest.effects import emit
from pool.models import AuditEvent, PolicyVersion, PromptGroup, Step, Trajectory
from pool.selectors.steps import branch_ends, steps_render
from pool.services import effective_reward
from pool.services.audit import audit_record

from ..events import LeaseChanged
from ..formats import RENDERERS
from ..models import Consumer, Dataset, Delivery, Lease, Skip
from ..selectors.specs import Compiled, dataset_steps, spec_compile, units_admitted
from ..specs import spec_parse

UNITS = ("groups", "steps")
FORMATS = tuple(RENDERERS)  # steps, padded, tree: see curation/formats.py
MAX_BATCH = 4096
MAX_LEASE_SECONDS = 24 * 3600
# Candidate units read per round (a multiple of the batch: some are not admitted, some go
# to another puller of the same consumer first).
CANDIDATE_FACTOR = 4
MAX_ROUNDS = 8


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts on consumers and leases: the source of its API key (None: an operator
    session) and whether it is an admin (admin key or operator), who may act on every
    consumer and lease. Services called without one (internal callers) act on all."""

    source_id: int | None
    admin: bool = False

    def owns(self, source_id: int | None) -> bool:
        return self.admin or (self.source_id is not None and source_id == self.source_id)


@dataclass(slots=True)
class PullIn:
    dataset: str
    batch_size: int = 64
    unit: str = "groups"
    format: str = "steps"
    lease_seconds: int = 300


def pull_validate(p: PullIn) -> None:
    if not isinstance(p.dataset, str) or not p.dataset:
        raise InvalidInput("dataset: the name of a dataset", field="dataset")
    if (
        not isinstance(p.batch_size, int)
        or isinstance(p.batch_size, bool)
        or not 1 <= p.batch_size <= MAX_BATCH
    ):
        raise InvalidInput(f"batch_size must be an integer in [1, {MAX_BATCH}]", field="batch_size")
    if p.unit not in UNITS:
        raise InvalidInput(f"unit must be one of {list(UNITS)}", field="unit")
    if p.format not in FORMATS:
        raise InvalidInput(f"format must be one of {list(FORMATS)}", field="format")
    if (
        not isinstance(p.lease_seconds, int)
        or isinstance(p.lease_seconds, bool)
        or not 1 <= p.lease_seconds <= MAX_LEASE_SECONDS
    ):
        raise InvalidInput(
            f"lease_seconds must be an integer in [1, {MAX_LEASE_SECONDS}]", field="lease_seconds"
        )


def consumer_pull(*, consumer: str, pull: PullIn, actor: Actor | None = None) -> Lease | None:
    """Lease the next batch of ``pull.dataset`` to ``consumer``, or None when nothing is
    ready for it. Not idempotent: each call leases new units. Raises InvalidInput or
    NotFound naming the field (``name`` for a consumer ``actor`` may not use; a consumer
    seen for the first time becomes ``actor``'s source's)."""
    _check_name(consumer)
    pull_validate(pull)
    ds = Dataset.objects.select_related("current").filter(name=pull.dataset).first()
    if ds is None or ds.current is None:
        raise NotFound(f"dataset {pull.dataset!r} does not exist", field="dataset")
    if pull.unit == "groups" and not spec_parse(ds.current.spec).grouping.keep_groups_whole:
        raise InvalidInput(
            "this dataset serves steps (keep_groups_whole is false): pull unit 'steps'", field="unit"
        )
    who = _consumer(consumer, actor)
    leases_expire(consumer_id=who.id)
    with transaction.atomic():
        now = timezone.now()
        lease = Lease.objects.create(
            id=uuid.uuid4(),
            consumer=who,
            dataset_version=ds.current,
            unit=pull.unit,
            format=pull.format,
            n_units=0,
            n_steps=0,
            content_hash="",
            body=b"",
            created_at=now,
            expires_at=now + timedelta(seconds=pull.lease_seconds),
        )
        c = spec_compile(spec_parse(ds.current.spec))
        steps = _claim(c, ds, who, lease, pull)
        if not steps:
            lease.delete()  # nothing leased; the units it skipped stay skipped
            return None
        _render(lease, ds, who, c, steps)
        lease.save(update_fields=["n_units", "n_steps", "content_hash", "body"])
        lease_changed(lease, consumer=who.name, dataset=ds.name, taken=1)
    return lease


def lease_ack(*, lease_id: uuid.UUID, consumer: str | None = None, actor: Actor | None = None) -> Lease:
    """Mark a leased batch consumed. Idempotent for an acked lease; an expired or released
    one raises Conflict (its units may already have gone to another pull); another
    source's lease NotFound."""
    with transaction.atomic():
        lease = _lease_locked(lease_id, consumer, actor)
        if lease.status == Lease.Status.ACKED:
            return lease
        if lease.status != Lease.Status.LEASED or lease.expires_at <= timezone.now():
            raise Conflict(
                f"lease {lease_id} is {_state(lease)}: its batch may be delivered again", field="lease"
            )
        lease.status, lease.acked_at = Lease.Status.ACKED, timezone.now()
        lease.save(update_fields=["status", "acked_at"])
        lease_changed(lease, consumer=consumer or "", dataset="", acked=1)
        return lease


def lease_nack(*, lease_id: uuid.UUID, consumer: str | None = None, actor: Actor | None = None) -> Lease:
    """Give a batch back: its units are deliverable again. Idempotent for a released or
    expired lease; an acked one raises Conflict; another source's lease NotFound."""
    with transaction.atomic():
        lease = _lease_locked(lease_id, consumer, actor)
        _release(lease)
        return lease


def lease_release(*, lease_id: uuid.UUID, actor: str = "") -> Lease:
    """An admin's nack of any consumer's lease (``POST /api/v1/leases/{id}/release``): its
    units are deliverable again. Audited (``lease.release``) when it ends an open lease;
    idempotent for a released or expired one; an acked one raises Conflict."""
    with transaction.atomic():
        lease = _lease_locked(lease_id, None, None)
        if _release(lease):
            consumer = Consumer.objects.filter(id=lease.consumer_id).values_list("name", "source_id").first()
            audit_record(
                action=AuditEvent.Action.LEASE_RELEASE,
                target=str(lease.id),
                actor=actor,
                details={"consumer": consumer[0], "source_id": consumer[1], "units": lease.n_units},
            )
        return lease


def _release(lease: Lease) -> bool:
    """Nack a locked lease; True if it was open."""
    if lease.status == Lease.Status.ACKED:
        raise Conflict(f"lease {lease.id} is acked", field="lease")
    if lease.status != Lease.Status.LEASED:
        return False
    Delivery.objects.filter(lease=lease).delete()
    lease.status = Lease.Status.RELEASED
    lease.save(update_fields=["status"])
    return True


def leases_expire(*, consumer_id: int | None = None, now=None) -> int:
    """End leases past their expiry: their units are deliverable again. Idempotent; also
    run by the periodic sweep for every consumer."""
    now = now or timezone.now()
    with transaction.atomic():
        expired = Lease.objects.filter(status=Lease.Status.LEASED, expires_at__lte=now)
        if consumer_id is not None:
            expired = expired.filter(consumer_id=consumer_id)
        ids = list(
            expired.select_for_update(skip_locked=connection.vendor == "postgresql").values_list(
                "id", flat=True
            )
        )
        if not ids:
            return 0
        Delivery.objects.filter(lease_id__in=ids).delete()
        return Lease.objects.filter(id__in=ids, status=Lease.Status.LEASED).update(
            status=Lease.Status.EXPIRED
        )


# --- helpers --------------------------------------------------------------------------------
def lease_changed(lease: Lease, *, consumer: str, dataset: str, taken: int = 0, acked: int = 0) -> None:
    """Emit ``LeaseChanged`` (its effect: the live ``lease`` event, after the commit)."""
    emit(
        LeaseChanged(
            lease_id=str(lease.id),
            consumer=consumer,
            dataset=dataset,
            status=lease.status,
            steps=lease.n_steps,
            taken=taken,
            acked=acked,
        )
    )


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise InvalidInput("a consumer name is 1-64 characters", field="name")
    problem = guard.ident_problem(name)
    if problem:
        raise InvalidInput(f"a consumer name {problem}", field="name")


def _consumer(name: str, actor: Actor | None) -> Consumer:
    """The consumer ``name``, created for ``actor``'s source on first sight; NotFound
    (``name``) when it is another source's."""
    _check_name(name)
    found = Consumer.objects.filter(name=name).first()
    if found is None:
        owner = actor.source_id if actor is not None else None
        Consumer.objects.bulk_create(
            [Consumer(name=name, source_id=owner)], ignore_conflicts=True
        )  # race-safe
        found = Consumer.objects.get(name=name)
    if actor is not None and not actor.owns(found.source_id):
        raise NotFound(f"consumer {name!r} does not exist for this API key's source", field="name")
    return found


def _lease_locked(lease_id, consumer: str | None, actor: Actor | None) -> Lease:
    q = Lease.objects.select_for_update().filter(id=lease_id)
    if consumer is not None:
        q = q.filter(consumer__name=consumer)
    if actor is not None and not actor.admin:
        # A subquery, not a join: FOR UPDATE locks the lease row only.
        q = q.filter(consumer_id__in=Consumer.objects.filter(source_id=actor.source_id).values("id"))
    lease = q.first()
    if lease is None:
        raise NotFound(f"lease {lease_id} does not exist", field="lease")
    return lease


def _state(lease: Lease) -> str:
    return "expired" if lease.status == Lease.Status.LEASED else lease.status


def _claim(c: Compiled, ds: Dataset, who: Consumer, lease: Lease, pull: PullIn) -> dict[int, bool]:
    """Claim up to batch_size admitted units; returns their {step id: masked}. Units the
    dataset does not admit, or its serving rules drop, are remembered as Skip rows with
    their reason (counted in ``lease.dropped``)."""
    taken: dict[int, bool] = {}
    n_units = 0
    drops = _Drops(c, who, lease.dataset_version_id)
    if c.spec.serving.capacity is not None:
        _drop_over_capacity(c, ds, who, drops, pull.unit)
    for _ in range(MAX_ROUNDS):
        want = pull.batch_size - n_units
        if want <= 0:
            break
        if pull.unit == "steps":
            rows = list(
                dataset_steps(c)
                .filter(*_not_taken(ds, who, drops, Delivery.Kind.STEP))
                .order_by("id")
                .values_list("id", "policy_version_id")[:want]
            )
            if not rows:
                break
            stale = {i for i, v in rows if drops.stale(v)}
            drops.add(Skip.Reason.STALE, [(Delivery.Kind.STEP, i, 1) for i in stale])
            fresh = [i for i, _v in rows if i not in stale]
            won = _insert(who, ds, lease, [(Delivery.Kind.STEP, i) for i in fresh])
            for _step_kind, key in won:
                taken[key] = False
            n_units += len(won)
            continue
        candidates = _ready_units(ds, who, drops, want * CANDIDATE_FACTOR)
        if not candidates:
            break
        groups = [k for k in candidates if k > 0]
        lone = [-k for k in candidates if k < 0]
        # The candidates' steps by trajectory id (index step_curation), not through a join.
        members = list(Trajectory.objects.filter(group_id__in=groups).values_list("id", flat=True))
        admitted = units_admitted(c, Q(trajectory_id__in=members + lone))
        drops.add(Skip.Reason.FILTERED, [(_kind(k), abs(k), None) for k in candidates if k not in admitted])
        stale = drops.stale_units(admitted)
        drops.add(Skip.Reason.STALE, [(_kind(k), abs(k), len(admitted[k])) for k in stale])
        order = [k for k in candidates if k in admitted and k not in stale][:want]
        won = _insert(who, ds, lease, [(_kind(k), abs(k)) for k in order])
        for kind, key in won:
            taken.update(admitted[key if kind == Delivery.Kind.GROUP else -key])
        n_units += len(won)
        if len(candidates) < want * CANDIDATE_FACTOR and len(won) == len(order):
            break  # every ready unit was looked at
    lease.n_units = n_units
    lease.dropped = dict(drops.counts)
    return taken


def _kind(key: int) -> int:
    """The Delivery kind of a unit key (a group's id, or minus a lone trajectory's id)."""
    return Delivery.Kind.GROUP if key > 0 else Delivery.Kind.TRAJECTORY


class _Drops:
    """A pull's drops: Skip rows with their reason and the current policy version, and
    their counts for the manifest; ``holds``: the Skip rows still in force (skip_holds)."""

    def __init__(self, c: Compiled, who: Consumer, version_id: int) -> None:
        self.who, self.version_id = who, version_id
        self.counts: Counter[str] = Counter()
        after, current = c.spec.serving.stale_after, c.current_version
        self.current = current
        # The oldest policy version still fresh; None: the rule is off (or no current version).
        self.oldest = current - after if after is not None and current is not None else None
        self.holds = skip_holds(current, max_staleness=c.spec.filters.max_staleness is not None)

    def stale(self, version: int | None) -> bool:
        return self.oldest is not None and (version is None or version < self.oldest)

    def stale_units(self, admitted: dict[int, dict[int, bool]]) -> set[int]:
        """The admitted units with a step staler than the serving rule allows."""
        if self.oldest is None or not admitted:
            return set()
        unit_of = {sid: k for k, steps in admitted.items() for sid in steps}
        out: set[int] = set()
        for sid, version in Step.objects.filter(id__in=list(unit_of)).values_list("id", "policy_version_id"):
            if self.stale(version):
                out.add(unit_of[sid])
        return out

    def add(self, reason: int, units: list[tuple[int, int, int | None]]) -> None:
        """Remember dropped units (kind, key, steps) under the current policy version;
        idempotent (a unit dropped by a concurrent pull of this consumer is dropped once). A
        unit looked at again (its drop no longer held) and dropped again gets its row
        rewritten."""
        if not units:
            return
        Skip.objects.bulk_create(
            [
                Skip(
                    consumer=self.who,
                    dataset_version_id=self.version_id,
                    kind=kind,
                    key=key,
                    reason=reason,
                    steps=steps,
                    policy_version=self.current,
                )
                for kind, key, steps in units
            ],
            update_conflicts=True,
            unique_fields=["consumer", "dataset_version", "kind", "key"],
            update_fields=["reason", "steps", "policy_version"],
        )
        self.counts[Skip.Reason(reason).label] += len(units)


def skip_holds(current: int | None, *, max_staleness: bool) -> Q:
    """The Skip rows still in force under the current policy version ``current``: a drop
    that does not depend on it (capacity; filtered, unless the dataset has
    filters.max_staleness), one made with no current version, and one made under ``current``
    or an older one (a unit stale then is staler now). A drop made under a newer current
    version than today's (the version moved back) no longer holds: the unit is looked at
    again, and dropped again (under today's version) only if it still does not pass."""
    depends = [Skip.Reason.STALE, *([Skip.Reason.FILTERED] if max_staleness else [])]
    holds = ~Q(reason__in=depends) | Q(policy_version__isnull=True)
    if current is not None:
        holds |= Q(policy_version__lte=current)
    return holds


def _not_taken(ds: Dataset, who: Consumer, drops: _Drops, kind: int) -> list:
    """Conditions on a unit's ``pk``: neither delivered to this consumer nor dropped for it
    under this dataset version by a drop that still holds (both EXISTS probes on unique
    indexes)."""
    done = Delivery.objects.filter(consumer=who, dataset=ds, kind=kind, key=OuterRef("pk"))
    skipped = Skip.objects.filter(
        drops.holds, consumer=who, dataset_version_id=drops.version_id, kind=kind, key=OuterRef("pk")
    )
    return [~Exists(done), ~Exists(skipped)]


def _pending(ds: Dataset, who: Consumer, drops: _Drops):
    """The two queues of ready units not yet offered to this consumer: ready groups (by
    ready_at, index group_ready) and completed trajectories without a group (by
    completed_at), as querysets of (ready time, id)."""
    groups = PromptGroup.objects.filter(ready_at__isnull=False).filter(
        *_not_taken(ds, who, drops, Delivery.Kind.GROUP)
    )
    lone = Trajectory.objects.filter(group__isnull=True, status=Trajectory.Status.COMPLETED).filter(
        *_not_taken(ds, who, drops, Delivery.Kind.TRAJECTORY)
    )
    return groups, "ready_at", lone, "completed_at"


def _ready_units(ds: Dataset, who: Consumer, drops: _Drops, limit: int) -> list[int]:
    """Unit keys not yet offered to this consumer, oldest-ready first, both queues merged."""
    groups, g_at, lone, l_at = _pending(ds, who, drops)
    g = list(groups.order_by(g_at, "id").values_list(g_at, "id")[:limit])
    t = list(lone.order_by(l_at, "id").values_list(l_at, "id")[:limit])
    merged = sorted([(at, k) for at, k in g] + [(at, -k) for at, k in t])
    return [k for _, k in merged[:limit]]


def _drop_over_capacity(c: Compiled, ds: Dataset, who: Consumer, drops: _Drops, unit: str) -> None:
    """Serving rule ``capacity``: keep the newest ``capacity`` units waiting for this
    consumer and drop the older ones. Reads the newest capacity+1 of each queue (an index
    scan backwards); only when the queue is over capacity does it read what to drop."""
    cap = c.spec.serving.capacity
    if unit == "steps":
        pending = dataset_steps(c).filter(*_not_taken(ds, who, drops, Delivery.Kind.STEP))
        cut = list(pending.order_by("-id").values_list("id", flat=True)[cap : cap + 1])
        if cut:
            old = pending.filter(id__lte=cut[0]).values_list("id", flat=True)
            drops.add(Skip.Reason.CAPACITY, [(Delivery.Kind.STEP, i, 1) for i in old])
        return
    groups, g_at, lone, l_at = _pending(ds, who, drops)
    newest = sorted(
        [(at, k) for at, k in groups.order_by(f"-{g_at}", "-id").values_list(g_at, "id")[: cap + 1]]
        + [(at, -k) for at, k in lone.order_by(f"-{l_at}", "-id").values_list(l_at, "id")[: cap + 1]],
        reverse=True,
    )
    if len(newest) <= cap:
        return
    keep = {k for _, k in newest[:cap]}
    at = newest[cap - 1][0]  # the oldest unit kept: everything ready before it goes
    old = [
        (Delivery.Kind.GROUP, k, None)
        for k in groups.filter(**{f"{g_at}__lte": at}).values_list("id", flat=True)
        if k not in keep
    ]
    old += [
        (Delivery.Kind.TRAJECTORY, k, None)
        for k in lone.filter(**{f"{l_at}__lte": at}).values_list("id", flat=True)
        if -k not in keep
    ]
    drops.add(Skip.Reason.CAPACITY, old)


def _insert(who: Consumer, ds: Dataset, lease: Lease, units: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Claim units with Delivery rows; returns those this call won (the others belong to
    a concurrent pull of the same consumer). One statement (sql.rows_insert_new)."""
    now = timezone.now()
    rows = [
        sql.new_instance(
            Delivery,
            {
                "consumer_id": who.id,
                "dataset_id": ds.id,
                "kind": int(kind),
                "key": key,
                "lease_id": lease.id,
                "created_at": now,
            },
        )
        for kind, key in units
    ]
    won = {
        (int(k), int(v))
        for k, v in sql.rows_insert_new(
            rows, conflict=("consumer_id", "dataset_id", "kind", "key"), returning=("kind", "key")
        )
    }
    return [u for u in units if (int(u[0]), u[1]) in won]


def _render(lease: Lease, ds: Dataset, who: Consumer, c: Compiled, taken: dict[int, bool]) -> None:
    """The batch in the lease's format (curation/formats.py), with its manifest, as the
    exact bytes served."""
    steps = list(
        Step.objects.with_context().filter(id__in=list(taken)).order_by("trajectory_id", "step_index")
    )
    current = c.current_version
    if current is None:
        current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    rows = steps_render(steps)
    assignment = c.spec.grouping.reward_assignment
    if assignment != effective_reward.EACH_STEP:
        effective_reward.assign(
            rows, mode=assignment, branch_ends=branch_ends({s.trajectory_id for s in steps})
        )
    versions: Counter[int | None] = Counter()
    for s, row in zip(steps, rows, strict=True):
        row["mask"] = taken[s.id]
        row["staleness"] = (
            (current - s.policy_version_id)
            if current is not None and s.policy_version_id is not None
            else None
        )
        versions[s.policy_version_id] += 1
    payload = dumps(RENDERERS[lease.format](rows))
    staleness = [r["staleness"] for r in rows if r["staleness"] is not None]
    manifest = {
        "lease_id": str(lease.id),
        "consumer": who.name,
        "dataset": ds.name,
        "dataset_version": lease.dataset_version.version,
        "unit": lease.unit,
        "format": lease.format,
        "units": lease.n_units,
        "step_uids": [s.uid for s in steps],
        "masked_steps": sum(1 for s in steps if taken[s.id]),
        # Units this pull dropped for the consumer, by reason (specs.Serving; Skip.Reason).
        "dropped": {r.label: getattr(lease, "dropped", {}).get(r.label, 0) for r in Skip.Reason},
        # Steps per policy version (JSON keys are strings); steps without one are counted
        # apart, never under a "None" key.
        "policy_versions": {str(v): versions[v] for v in sorted(v for v in versions if v is not None)},
        "steps_without_policy_version": versions.get(None, 0),
        "reward_assignment": assignment,
        "current_policy_version": current,
        "staleness": {"min": min(staleness), "max": max(staleness)} if staleness else None,
        "content_hash": hashlib.sha256(payload).hexdigest(),
        "created_at": lease.created_at,
        "expires_at": lease.expires_at,
    }
    lease.n_steps = len(steps)
    lease.content_hash = manifest["content_hash"]
    # The body: manifest, then the batch payload spliced in as is (hashed bytes = served bytes).
    lease.body = dumps({"lease_id": str(lease.id), "manifest": manifest})[:-1] + b',"batch":' + payload + b"}"
