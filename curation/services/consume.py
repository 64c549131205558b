"""Consumption: trainers pull batches of what a dataset admits, under leases.

A pull claims units (whole prompt groups, lone trajectories, or steps) for one consumer by
inserting ``Delivery`` rows, unique per (consumer, dataset, unit, use index): concurrent
pullers of one consumer can never both claim a unit, on PostgreSQL or SQLite, and a unit
lost to another puller is simply replaced by the next candidate. Ready units are offered in
the dataset's serving order (specs.Serving ``order``: oldest ready first by default, newest
ready first, or by a priority score, ties oldest first); a unit that is not ready is never a
candidate, so it blocks nothing.

Reuse (``serving.reuse``): a unit may go to one consumer up to ``max_uses`` times, one use at
a time (a unit in an open lease is not offered to that consumer again until the lease ends),
each Delivery row recording its ``use_index`` (0, 1, ...: the uses acked before it). An ack
consumes the use; a nack or expiry deletes its row, so the same use index is offered again.
Acked uses are therefore always 0..n-1, the next use is n, and the unique row keeps two
pullers from taking the same use. Without reuse every use index is 0: exactly once.

A lease ends by ack (its units are consumed by that consumer for good), nack or expiry (its
Delivery rows go, the units are candidates again). The batch is stored byte for byte with
its manifest, so ``GET /api/v1/leases/{id}/batch`` replays exactly what was trained on.

Consumer names are per source (``consumer_of``): a key's "trainer" is its source's, and
another source's "trainer" is another consumer it never collides with nor sees. Leases are
their consumer's source's: another source's keys get NotFound for them; admins (admin keys,
operators) ack, nack, replay and release any lease by id.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal

import msgspec
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.db.models import (
    BigIntegerField,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce
from django.utils import timezone

from claw_kit.web import guard
from claw_kit.web.renderers import dumps
from pool import compiled, sql, tokens
from pool.bus import GroupsReady, emit
from pool.errors import Conflict, InvalidInput, NotFound
from pool.lookups import Many
from pool.models import AuditEvent, PromptGroup, Step, Trajectory
from pool.selectors.policy import policy_current_version
from pool.selectors.steps import steps_read
from pool.services import effective_reward
from pool.services.audit import audit_record
from pool.services.delivery import trajectories_delivered_mark

from ..events import LeaseChanged
from ..formats import RENDERERS
from ..models import Consumer, Dataset, Delivery, GroupScore, Lease, Skip
from ..selectors.consumption import consumer_of
from ..selectors.specs import Compiled, dataset_steps, spec_compile, units_admitted
from ..specs import spec_parse, struct_parse
from .cursors import QUEUES, Cursors, after_position, cursors_rewind

MAX_BATCH = 4096
MAX_LEASE_SECONDS = 24 * 3600
MAX_WAIT_SECONDS = 30.0
# Candidate units read per round (a multiple of the batch: some are not admitted, some go
# to another puller of the same consumer first).
CANDIDATE_FACTOR = 4
MAX_ROUNDS = 8
# Groups scored per statement by group_scores_refresh (bounded statements on SQLite too).
SCORE_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts on consumers and leases: the source of its API key (None: an operator
    session) and whether it is an admin (admin key or operator), who may act on every
    consumer and lease. Services called without one (internal callers) act on all."""

    source_id: int | None
    admin: bool = False

    def owns(self, source_id: int | None) -> bool:
        return self.admin or (self.source_id is not None and source_id == self.source_id)


class PullIn(msgspec.Struct, forbid_unknown_fields=True):
    """What a trainer asks of ``POST /api/v1/consumers/<name>/pull``: the one pull contract.
    The API's schema (curation/serializers.py), the fields it accepts, the dashboard's batch
    form's choices and every check derive from it (``pull_parse``, ``pull_validate``)."""

    dataset: Annotated[
        str, msgspec.Meta(min_length=1, description="the dataset's name; its current version is served")
    ]
    batch_size: Annotated[int, msgspec.Meta(ge=1, le=MAX_BATCH, description="units per batch")] = 64
    unit: Literal["groups", "steps"] = "groups"
    format: Annotated[
        Literal["steps", "padded", "tree"],
        msgspec.Meta(
            description="steps: the rows as read; padded: verl-style 2-D arrays; tree: packed prefix tree"
        ),
    ] = "steps"
    lease_seconds: Annotated[int, msgspec.Meta(ge=1, le=MAX_LEASE_SECONDS)] = 300
    wait: Annotated[
        float, msgspec.Meta(ge=0, le=MAX_WAIT_SECONDS, description="long-poll: seconds to wait for a batch")
    ] = 0.0


def _choices(name: str) -> tuple[str, ...]:
    """The values a Literal field of PullIn takes."""
    tp = next(f.type for f in msgspec.inspect.type_info(PullIn).fields if f.name == name)  # type: ignore[attr-defined]
    return tuple((tp.type if isinstance(tp, msgspec.inspect.Metadata) else tp).values)


UNITS, FORMATS = _choices("unit"), _choices("format")
assert set(FORMATS) == set(RENDERERS), "every pull format has a renderer (curation/formats.py)"


def pull_parse(raw: Any) -> PullIn:
    """A pull's JSON body as a PullIn, or InvalidInput naming the field."""
    return struct_parse(raw, PullIn)


def pull_validate(p: PullIn) -> None:
    """A PullIn built in code (its constructor checks no bound) checked as the API's would be."""
    struct_parse(msgspec.structs.asdict(p), PullIn)


def consumer_pull(*, consumer: str, pull: PullIn, actor: Actor | None = None) -> Lease | None:
    """Lease the next batch of ``pull.dataset`` to ``consumer``, or None when nothing is
    ready for it. Not idempotent: each call leases new units. Raises InvalidInput or
    NotFound naming the field. ``consumer`` names ``actor``'s source's consumer (names are
    per source: consumer_of), created on its first pull."""
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
    with transaction.atomic():
        leases_expire(consumer_id=who.id)
        now = timezone.now()
        # Inserted once, whole, after the claim (its Delivery rows' foreign key is checked
        # at commit): one statement instead of an empty row now and its body later.
        lease = Lease(
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
            return None  # nothing leased; the units it skipped stay skipped
        # Before the batch is read: from here on these trajectories' rewards are frozen, and a
        # reward that committed first is in the batch (pool/services/delivery.py).
        present = trajectories_delivered_mark(step_ids=steps)
        if len(present) < len(steps):  # a retention pass removed some units since the claim
            steps = _unclaim_removed(lease, steps, present)
            if not steps:
                return None
        _render(lease, ds, who, c, steps)
        sql.row_insert(lease)
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
    _give_back(Delivery.objects.filter(lease=lease))
    lease.status = Lease.Status.RELEASED
    lease.save(update_fields=["status"])
    return True


def _give_back(deliveries) -> None:
    """Delete these Delivery rows (their units are deliverable again) and move the pull
    cursors that had passed them back (services.cursors)."""
    cursors_rewind(deliveries.values_list("consumer_id", "dataset_id", "kind", "key"))
    deliveries.delete()


def leases_expire(*, consumer_id: int | None = None, now=None) -> int:
    """End leases past their expiry: their units are deliverable again. Idempotent; also
    run by the periodic sweep for every consumer."""
    now = now or timezone.now()
    # Inside a pull's transaction no savepoint of its own (one statement when none expired).
    with transaction.atomic(savepoint=False):
        ids = [i for (i,) in compiled.read(_expired, now=now, consumer_id=consumer_id)]
        if not ids:
            return 0
        _give_back(Delivery.objects.filter(lease_id__in=ids))
        return Lease.objects.filter(id__in=ids, status=Lease.Status.LEASED).update(
            status=Lease.Status.EXPIRED
        )


def group_scores_refresh(event: GroupsReady) -> None:
    """The effect of ready groups on serving (curation/apps.py): write each group's scores
    (GroupScore: reward spread, stalest policy version, ready time) for order priority.
    Idempotent (an upsert from the current rows); runs inside the settle's transaction,
    before the group's ready_at is written (a group without one is ready now). Two
    statements per chunk of groups: the scores' inputs (sql.groups_score_inputs), then the
    upsert."""
    ids = sorted(event.group_ids)
    now = timezone.now()
    for i in range(0, len(ids), SCORE_CHUNK):
        inputs = sql.groups_score_inputs(ids[i : i + SCORE_CHUNK])
        GroupScore.objects.bulk_create(
            [
                GroupScore(
                    group_id=gid, reward_std=_pstdev(values), policy_version=version, ready_at=ready_at or now
                )
                for gid, (ready_at, values, version) in inputs.items()
            ],
            update_conflicts=True,
            unique_fields=["group"],
            update_fields=["reward_std", "policy_version", "ready_at"],
        )


def _pstdev(values: list[float]) -> float:
    """Population standard deviation (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


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


def _expired(*, now, consumer_id: int | None):
    """The build of ``leases_expire``'s read (pool/compiled.py): a pull runs it each time."""
    expired = Lease.objects.filter(status=Lease.Status.LEASED, expires_at__lte=now)
    if consumer_id is not None:
        expired = expired.filter(consumer_id=consumer_id)
    return expired.select_for_update(skip_locked=connection.vendor == "postgresql").values_list("id")


def _members(*, groups: Many):
    """The build of a pull's read of its candidate groups' trajectories (pool/compiled.py)."""
    return Trajectory.objects.filter(group_id__any=groups).values_list("id")


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise InvalidInput("a consumer name is 1-64 characters", field="name")
    problem = guard.ident_problem(name)
    if problem:
        raise InvalidInput(f"a consumer name {problem}", field="name")


def _consumer(name: str, actor: Actor | None) -> Consumer:
    """The consumer ``name`` of ``actor``'s source (consumer_of), created on first sight
    (race-safe: a concurrent first pull's row is kept)."""
    _check_name(name)
    owner = actor.source_id if actor is not None else None
    found = consumer_of(name, source_id=owner)
    if found is None:
        Consumer.objects.bulk_create([Consumer(name=name, source_id=owner)], ignore_conflicts=True)
        found = consumer_of(name, source_id=owner)
        assert found is not None
    return found


def _lease_locked(lease_id, consumer: str | None, actor: Actor | None) -> Lease:
    restricted = actor is not None and not actor.admin
    rows = compiled.read(
        _lease_for_update,
        lease_id=lease_id,
        consumer=consumer,
        restricted=restricted,
        source_id=actor.source_id if restricted else None,
    )
    if not rows:
        raise NotFound(f"lease {lease_id} does not exist", field="lease")
    return Lease.from_db(DEFAULT_DB_ALIAS, _LEASE_READ, rows[0])


# Without the body (the served batch, ~190 kB for 64 W-pool steps): no ack, nack or release
# reads it (the instance holds it deferred).
_LEASE_READ = tuple(f.attname for f in Lease._meta.concrete_fields if f.name != "body")


def _lease_for_update(*, lease_id, consumer: str | None, restricted: bool, source_id: int | None):
    """The build of a lease's locked read by its id (pool/compiled.py: every ack makes it)."""
    q = Lease.objects.select_for_update().filter(id=lease_id)
    if consumer is not None:
        q = q.filter(consumer__name=consumer)
    if restricted:
        # A subquery, not a join: FOR UPDATE locks the lease row only.
        q = q.filter(consumer_id__in=Consumer.objects.filter(source_id=source_id).values("id"))
    return q.order_by("id").values_list(*_LEASE_READ)[:1]


def _state(lease: Lease) -> str:
    return "expired" if lease.status == Lease.Status.LEASED else lease.status


def _claim(c: Compiled, ds: Dataset, who: Consumer, lease: Lease, pull: PullIn) -> dict[int, bool]:
    """Claim up to batch_size admitted units; returns their {step id: masked}. Units the
    dataset does not admit, or its serving rules drop, are remembered as Skip rows with
    their reason (counted in ``lease.dropped``)."""
    taken: dict[int, bool] = {}
    uses: dict[int, int] = {}  # step id -> the use index of its unit
    n_units = 0
    drops = _Drops(c, who, lease.dataset_version_id)
    if pull.unit == "groups" and not drops.order.reuse and drops.order.order == "oldest_ready":
        drops.cursors = Cursors(
            consumer_id=who.id, dataset_id=ds.id, version_id=drops.version_id, current=drops.current
        )
    if c.spec.serving.capacity is not None:
        _drop_over_capacity(c, ds, who, drops, pull.unit)
    for _ in range(MAX_ROUNDS):
        want = pull.batch_size - n_units
        if want <= 0:
            break
        if pull.unit == "steps":
            rows = _ready_steps(c, ds, who, drops, want)
            if not rows:
                break
            stale = {i for i, v, _u in rows if drops.stale(v)} if not drops.serve else set()
            drops.add(Skip.Reason.STALE, [(Delivery.Kind.STEP, i, 1) for i in stale])
            fresh = [(Delivery.Kind.STEP, i, u) for i, _v, u in rows if i not in stale]
            won = _insert(who, ds, lease, fresh)
            for _step_kind, key, use in won:
                taken[key] = False
                uses[key] = use
            n_units += len(won)
            continue
        candidates = _ready_units(ds, who, drops, want * CANDIDATE_FACTOR)
        if not candidates:
            break
        use_of = dict(candidates)
        groups = [k for k, _u in candidates if k > 0]
        lone = [-k for k, _u in candidates if k < 0]
        # The candidates' steps by trajectory id (index step_traj_index_uniq, covering), their trajectories
        # by primary key (not a hash of the whole table), their admission one statement.
        members = [t for (t,) in compiled.read(_members, groups=Many(groups))]
        admitted = units_admitted(c, members + lone)
        drops.add(
            Skip.Reason.FILTERED, [(_kind(k), abs(k), None) for k, _u in candidates if k not in admitted]
        )
        stale = drops.stale_units(admitted)
        drops.add(Skip.Reason.STALE, [(_kind(k), abs(k), len(admitted[k])) for k in stale])
        order = [k for k, _u in candidates if k in admitted and k not in stale][:want]
        won = _insert(who, ds, lease, [(_kind(k), abs(k), use_of[k]) for k in order])
        for kind, key, use in won:
            unit = admitted[key if kind == Delivery.Kind.GROUP else -key]
            taken.update(unit)
            uses.update(dict.fromkeys(unit, use))
        n_units += len(won)
        if len(candidates) < want * CANDIDATE_FACTOR and len(won) == len(order):
            break  # every ready unit was looked at
    if drops.cursors is not None:
        drops.cursors.advance()
    lease.n_units = n_units
    lease.dropped = dict(drops.counts)
    lease.uses = uses
    return taken


def _unclaim_removed(lease: Lease, steps: dict[int, bool], present: set[int]) -> dict[int, bool]:
    """The claim less the units a retention pass removed between the claim and the
    delivery's lock (trajectories_delivered_mark): their Delivery rows go (nothing of them is
    served, and no lease records a unit the pool no longer holds); returns the steps left."""
    gone = Delivery.objects.filter(lease_id=lease.id).filter(
        Q(kind=Delivery.Kind.GROUP) & ~Q(Exists(PromptGroup.objects.filter(id=OuterRef("key"))))
        | Q(kind=Delivery.Kind.TRAJECTORY) & ~Q(Exists(Trajectory.objects.filter(id=OuterRef("key"))))
        | Q(kind=Delivery.Kind.STEP) & ~Q(Exists(Step.objects.filter(id=OuterRef("key"))))
    )
    removed, _ = gone.delete()
    lease.n_units -= removed
    lease.uses = {s: u for s, u in lease.uses.items() if s in present}
    return {s: masked for s, masked in steps.items() if s in present}


def _kind(key: int) -> int:
    """The Delivery kind of a unit key (a group's id, or minus a lone trajectory's id)."""
    return Delivery.Kind.GROUP if key > 0 else Delivery.Kind.TRAJECTORY


class _Drops:
    """A pull's drops: Skip rows with their reason and the current policy version, and
    their counts for the manifest; ``holds``: the Skip rows still in force (skip_holds)."""

    def __init__(self, c: Compiled, who: Consumer, version_id: int) -> None:
        self.who, self.version_id = who, version_id
        self.order = _Order.of(c)
        self.counts: Counter[str] = Counter()
        after, current = c.spec.serving.stale_after, c.current_version
        self.current = current
        # The oldest policy version still fresh; None: the rule is off (or no current version).
        self.oldest = current - after if after is not None and current is not None else None
        # stale_mode "serve": stale units are served (their steps carry versions_behind).
        self.serve = c.spec.serving.stale_mode == "serve"
        self.max_staleness = c.spec.filters.max_staleness is not None
        self.holds = skip_holds(current, max_staleness=self.max_staleness)
        # Where an oldest-first pull of groups reads its queues from (services.cursors).
        self.cursors: Cursors | None = None

    def not_taken(self, ds: Dataset, kind: int) -> list:
        """``_not_taken`` for this pull's consumer, dataset version, drops and order."""
        return _not_taken(ds.id, self.who.id, self.version_id, self.holds, self.order, kind)

    def stale(self, version: int | None) -> bool:
        return self.oldest is not None and (version is None or version < self.oldest)

    def stale_units(self, admitted: dict[int, dict[int, bool]]) -> set[int]:
        """The admitted units with a step staler than the serving rule allows."""
        if self.oldest is None or self.serve or not admitted:
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


@dataclass(frozen=True, slots=True)
class _Order:
    """A dataset's serving order and reuse budget (specs.Serving), as a pull applies them."""

    order: str  # oldest_ready, newest_ready, priority
    priority: str | None  # reward_std, staleness (order priority)
    max_uses: int
    decay: float

    @classmethod
    def of(cls, c: Compiled) -> _Order:
        s = c.spec.serving
        return cls(s.order, s.priority, s.reuse.max_uses if s.reuse else 1, s.reuse.decay if s.reuse else 0.0)

    @property
    def reuse(self) -> bool:
        return self.max_uses > 1

    def rank(self, qs, *, at: str, base, kind: int, ds: Dataset, who: Consumer, limit: int) -> list:
        """The first ``limit`` rows of a queue of units (``qs``, ready time ``at``, score
        ``base`` for order priority) in this order, as (ready time, id, uses, priority).
        Without reuse the oldest_ready statement is today's (``at``, id; index group_ready);
        order priority without reuse orders by the score's own column (gscore_spread,
        gscore_fresh for groups)."""
        cols = [at, "id"]
        if self.reuse:
            qs = qs.annotate(_uses=_uses(ds, who, kind))
        if self.order == "priority":
            # Trinity-RFT's effective priority: base - decay x uses.
            prio = (
                ExpressionWrapper(base - self.decay * F("_uses"), output_field=FloatField())
                if self.reuse
                else base
            )
            qs = qs.annotate(_prio=prio)
            keys = [F("_prio").desc(), at, "id"]
        elif self.order == "newest_ready":
            keys = [f"-{at}", "-id"]
        else:
            keys = [at, "id"]
        if self.reuse and self.order != "priority":
            keys.insert(0, "_uses")  # fewer uses first
        cols += ["_uses" if self.reuse else Value(0), "_prio" if self.order == "priority" else Value(0.0)]
        if not self.reuse and self.order != "priority":
            cols = cols[:2]  # today's statement
        rows = list(qs.order_by(*keys).values_list(*cols)[:limit])
        return [(r[0], r[1], 0, 0.0) for r in rows] if len(cols) == 2 else rows

    def sort_key(self, row: tuple):
        """The merge key of a (ready time, signed key, uses, priority) row of either queue."""
        at, key, uses, prio = row
        if self.order == "priority":
            return (-prio, at, key)
        if self.order == "newest_ready":
            return (uses, _Desc((at, key)))
        return (uses, at, key)


class _Desc:
    """Sorts its value in reverse (newest_ready's merge key)."""

    __slots__ = ("v",)

    def __init__(self, v) -> None:
        self.v = v

    def __lt__(self, other: _Desc) -> bool:
        return self.v > other.v

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.v == other.v


def _uses(ds: Dataset, who: Consumer, kind: int):
    """A unit's uses by this consumer (its Delivery rows: acked uses; none is open where the
    unit is a candidate), a subquery on ``pk`` (a prefix of delivery_use_once)."""
    n = (
        Delivery.objects.filter(consumer=who, dataset=ds, kind=kind, key=OuterRef("pk"))
        .order_by()
        .values("key")
        .annotate(n=Count("id"))
        .values("n")[:1]
    )
    return Coalesce(Subquery(n), 0)


def _not_taken(
    dataset_id: int, consumer_id: int, version_id: int, holds: Q, order: _Order, kind: int
) -> list:
    """Conditions on a unit's ``pk``: not delivered to this consumer (with reuse: not held by
    an open lease of it, and its last use not taken) nor dropped for it under this dataset
    version by a drop that still holds (``holds``: skip_holds; EXISTS probes on unique
    indexes). Plain values, so a compiled read (``_oldest_first``) can stand in for them."""
    done = Delivery.objects.filter(
        consumer_id=consumer_id, dataset_id=dataset_id, kind=kind, key=OuterRef("pk")
    )
    skipped = Skip.objects.filter(
        holds, consumer_id=consumer_id, dataset_version_id=version_id, kind=kind, key=OuterRef("pk")
    )
    if not order.reuse:
        return [~Exists(done), ~Exists(skipped)]
    # Acked uses are 0..n-1 and at most one is open: "uses < max_uses, none open" is two
    # probes of delivery_use_once.
    return [
        ~Exists(done.filter(lease__status=Lease.Status.LEASED)),
        ~Exists(done.filter(use_index__gte=order.max_uses - 1)),
        ~Exists(skipped),
    ]


def _queue(kind: int, not_taken: list) -> QuerySet:
    """One queue of ready units not yet offered to this consumer (``not_taken``): ready
    groups (by ready_at, index group_ready) or completed trajectories without a group (by
    completed_at)."""
    if kind == Delivery.Kind.GROUP:
        qs = PromptGroup.objects.filter(ready_at__isnull=False)
    else:
        qs = Trajectory.objects.filter(group__isnull=True, status=Trajectory.Status.COMPLETED)
    return qs.filter(*not_taken)


def _pending(ds: Dataset, drops: _Drops):
    """The two queues (``_queue``) as querysets of (ready time, id)."""
    group, lone = Delivery.Kind.GROUP, Delivery.Kind.TRAJECTORY
    return (
        _queue(group, drops.not_taken(ds, group)),
        "ready_at",
        _queue(lone, drops.not_taken(ds, lone)),
        "completed_at",
    )


@compiled.shaped
def _oldest_first(kind: int, *, limit: int):
    """The build of one queue's oldest-first read without reuse (pool/compiled.py: compiled
    once per queue and bound): its first ``limit`` untaken units as (ready time, id), past the
    consumer's cursor position (``at``, ``key``) when it has one."""
    field = QUEUES[kind][1]

    def build(*, dataset_id, consumer_id, version_id, current, max_staleness, at, key) -> QuerySet:
        holds = skip_holds(current, max_staleness=max_staleness)
        qs = _queue(kind, _not_taken(dataset_id, consumer_id, version_id, holds, _ONCE, kind))
        if at is not None:
            qs = after_position(qs, field, at, key)
        return qs.order_by(field, "id").values_list(field, "id")[:limit]

    return build


_ONCE = _Order("oldest_ready", None, 1, 0.0)  # an oldest-first order without reuse


def _ready_units(ds: Dataset, who: Consumer, drops: _Drops, limit: int) -> list[tuple[int, int]]:
    """(unit key, use index) of the units this consumer may take, in the serving order, both
    queues merged (group keys positive, lone trajectories' negative). Order priority reads
    groups from their scores (GroupScore: gscore_spread, gscore_fresh); a lone trajectory
    has no spread (0) and its own policy version."""
    o = drops.order
    if not o.reuse and o.order == "oldest_ready":  # today's statements and merge
        cur = drops.cursors
        found = []
        for kind in (Delivery.Kind.GROUP, Delivery.Kind.TRAJECTORY):
            floor = cur.position(kind) if cur is not None else None
            at, key = floor if floor is not None else (None, None)
            rows = compiled.read(
                _oldest_first(kind, limit=limit),
                max_staleness=drops.max_staleness,
                dataset_id=ds.id,
                consumer_id=who.id,
                version_id=drops.version_id,
                current=drops.current,
                at=at,
                key=key,
            )
            if cur is not None:
                cur.found(kind, rows[0] if rows else None)
            found.append(rows)
        g, t = found
        merged = sorted([(at, k) for at, k in g] + [(at, -k) for at, k in t])
        return [(k, 0) for _, k in merged[:limit]]
    groups, g_at, lone, l_at = _pending(ds, drops)
    g_base = l_base = None
    if o.order == "priority":
        groups, g_at = groups.filter(serving_score__isnull=False), "serving_score__ready_at"
        if o.priority == "reward_std":
            g_base, l_base = F("serving_score__reward_std"), Value(0.0)
        else:
            g_base, l_base = (
                F("serving_score__policy_version"),
                Coalesce(F("policy_version_id"), -1, output_field=BigIntegerField()),
            )
    g = o.rank(groups, at=g_at, base=g_base, kind=Delivery.Kind.GROUP, ds=ds, who=who, limit=limit)
    t = o.rank(lone, at=l_at, base=l_base, kind=Delivery.Kind.TRAJECTORY, ds=ds, who=who, limit=limit)
    rows = [(at, k, u, p) for at, k, u, p in g] + [(at, -k, u, p) for at, k, u, p in t]
    return [(k, u) for _at, k, u, _p in sorted(rows, key=o.sort_key)[:limit]]


def _ready_steps(c: Compiled, ds: Dataset, who: Consumer, drops: _Drops, limit: int) -> list[tuple]:
    """(step id, policy version, use index) of the steps this consumer may take, in the
    serving order (a step's age is its id; its spread its group's, 0 without a score)."""
    o = drops.order
    pending = dataset_steps(c).filter(*drops.not_taken(ds, Delivery.Kind.STEP))
    if not o.reuse and o.order == "oldest_ready":  # today's statement
        return [(i, v, 0) for i, v in pending.order_by("id").values_list("id", "policy_version_id")[:limit]]
    base = None
    if o.priority == "reward_std":
        base = Coalesce(F("trajectory__group__serving_score__reward_std"), Value(0.0))
    elif o.priority == "staleness":
        base = Coalesce(F("policy_version_id"), -1, output_field=BigIntegerField())
    ranked = o.rank(
        pending.annotate(_at=F("id")),
        at="_at",
        base=base,
        kind=Delivery.Kind.STEP,
        ds=ds,
        who=who,
        limit=limit,
    )
    ids = [i for _at, i, _u, _p in ranked]
    versions = dict(Step.objects.filter(id__in=ids).values_list("id", "policy_version_id"))
    return [(i, versions[i], u) for _at, i, u, _p in ranked]


def _drop_over_capacity(c: Compiled, ds: Dataset, who: Consumer, drops: _Drops, unit: str) -> None:
    """Serving rule ``capacity``: keep the newest ``capacity`` units waiting for this
    consumer and drop the older ones. Reads the newest capacity+1 of each queue (an index
    scan backwards); only when the queue is over capacity does it read what to drop."""
    cap = c.spec.serving.capacity
    if unit == "steps":
        pending = dataset_steps(c).filter(*drops.not_taken(ds, Delivery.Kind.STEP))
        cut = list(pending.order_by("-id").values_list("id", flat=True)[cap : cap + 1])
        if cut:
            old = pending.filter(id__lte=cut[0]).values_list("id", flat=True)
            drops.add(Skip.Reason.CAPACITY, [(Delivery.Kind.STEP, i, 1) for i in old])
        return
    groups, g_at, lone, l_at = _pending(ds, drops)
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


def _insert(
    who: Consumer, ds: Dataset, lease: Lease, units: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """Claim (kind, key, use index) units with Delivery rows; returns those this call won
    (the others belong to a concurrent pull of the same consumer, which took that use
    first). One statement (sql.rows_insert_new)."""
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
                "use_index": use,
            },
        )
        for kind, key, use in units
    ]
    won = {
        (int(k), int(v))
        for k, v in sql.rows_insert_new(
            rows,
            conflict=("consumer_id", "dataset_id", "kind", "key", "use_index"),
            returning=("kind", "key"),
        )
    }
    return [u for u in units if (int(u[0]), u[1]) in won]


def _render(lease: Lease, ds: Dataset, who: Consumer, c: Compiled, taken: dict[int, bool]) -> None:
    """The batch in the lease's format (curation/formats.py), with its manifest, as the
    exact bytes served."""
    read = steps_read(list(taken), order=("trajectory_id", "step_index"))
    current = c.current_version
    if current is None:
        current = policy_current_version(c.spec.filters.policy)  # moved since the compile
    rows = read.rows
    assignment = c.spec.grouping.reward_assignment
    effective_reward.assign(
        rows, mode=assignment, gamma=c.spec.grouping.gamma, trajectory_ids=set(read.trajectory_ids)
    )
    versions: Counter[int | None] = Counter()
    drops = _Drops(c, who, lease.dataset_version_id)
    stale_steps = 0
    for sid, row in zip(read.ids, rows, strict=True):
        version = row["policy_version"]
        row["mask"] = taken[sid]
        row["staleness"] = (current - version) if current is not None and version is not None else None
        # The same, under the name the per-token field shares (token_versions_behind: per
        # response token, from the step's token_policy_versions; None without them).
        row["versions_behind"] = row["staleness"]
        runs = row["token_policy_versions"]
        row["token_versions_behind"] = (
            current - tokens.runs_expand(runs) if current is not None and runs is not None else None
        )
        versions[version] += 1
        stale_steps += drops.stale(version)
    uids = [r["uid"] for r in rows]  # before the format renders the rows
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
        "step_uids": uids,
        "masked_steps": sum(1 for sid in read.ids if taken[sid]),
        # Units this pull dropped for the consumer, by reason (specs.Serving; Skip.Reason).
        "dropped": {r.label: getattr(lease, "dropped", {}).get(r.label, 0) for r in Skip.Reason},
        # Steps per policy version (JSON keys are strings); steps without one are counted
        # apart, never under a "None" key.
        "policy_versions": {str(v): versions[v] for v in sorted(v for v in versions if v is not None)},
        "steps_without_policy_version": versions.get(None, 0),
        "reward_assignment": assignment,
        "current_policy_version": current,
        "staleness": {"min": min(staleness), "max": max(staleness)} if staleness else None,
        # Steps served that serving.stale_after calls stale (stale_mode "serve"; 0 under "drop").
        "stale_steps": stale_steps,
        "content_hash": hashlib.sha256(payload).hexdigest(),
        "created_at": lease.created_at,
        "expires_at": lease.expires_at,
    }
    if _Order.of(c).reuse:
        # serving.reuse: the use index of each step's unit, beside step_uids (absent without
        # reuse, where every use is 0: the manifest stays as it was).
        manifest["use_indexes"] = [getattr(lease, "uses", {}).get(sid, 0) for sid in read.ids]
    lease.n_steps = len(read.ids)
    lease.content_hash = manifest["content_hash"]
    # The body: manifest, then the batch payload spliced in as is (hashed bytes = served bytes).
    lease.body = dumps({"lease_id": str(lease.id), "manifest": manifest})[:-1] + b',"batch":' + payload + b"}"
