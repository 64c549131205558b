"""Policy versions: registering them, and moving a policy's current one (bounded, audited).

Policies are named (pool.models.Policy; ``default`` when a call names none, the one policy
of before). Each has its current version and its owners: a restricted caller (a policy key:
``sources``) moves only a policy one of its sources owns, and the first to move an unowned
policy owns it; another source's policy answers 404, as an unknown one would to a reader.
A move is bounded per call (CLAW_POLICY_MAX_STEP) and per minute
(CLAW_POLICY_MAX_ADVANCE_PER_MINUTE, by default the same bound: a key cannot make up for the
per-call bound by calling often); past that it is a 429 ``policy_rate_limited`` naming
``version``. The per-minute bound counts the moves of restricted callers (keys) only: admin
keys and operators are trusted with the rate. Admins' ``force`` skips both bounds.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from ..bus import PolicyPublished, emit
from ..errors import Conflict, InvalidInput, NotFound, PoolError
from ..models import AuditEvent, Policy, PolicyOwner, PolicyVersion
from ..tenancy import Sources
from .audit import audit_record

WINDOW = timedelta(minutes=1)
_POLICY_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class PolicyRateLimited(PoolError):
    """A policy's current version moved further within a minute than
    CLAW_POLICY_MAX_ADVANCE_PER_MINUTE allows."""

    status_code = 429
    code = "policy_rate_limited"


# Advisory lock key for "switch the current policy version" (arbitrary, fixed).
_SWITCH_LOCK = 0x436C6177_5056


@transaction.atomic
def policy_version_set(
    *,
    version: int,
    current: bool = True,
    metadata: dict | None = None,
    force: bool = False,
    actor: str = "",
    details: dict[str, Any] | None = None,
    policy: str = Policy.DEFAULT,
    source_id: int | None = None,
    sources: Sources = None,
    run: str | None = None,
) -> PolicyVersion:
    """Register a version and (by default) make it ``policy``'s current one. Idempotent.
    Concurrent switches serialise on the policy's row lock (and a transaction-scoped lock on
    PostgreSQL, for the first creation), so the one-current constraint never fires.

    ``sources`` (pool/tenancy.py; None: unrestricted, admins and operators): a policy owned
    by none of them is NotFound naming ``policy``; an unowned one becomes ``source_id``'s.
    The current version only moves forward, by at most ``CLAW_POLICY_MAX_STEP`` over the
    current one (over 0 when there is none): a jump further, or any move back, raises
    Conflict naming ``version``; and, for a restricted caller, by at most
    CLAW_POLICY_MAX_ADVANCE_PER_MINUTE within a minute over all restricted callers' moves:
    further raises PolicyRateLimited (429) naming ``version``; neither unless
    ``force`` (who may force is the caller's check: the API lets admins only). Nothing is
    written when it raises. Every change of a current version is audited (``policy.current``:
    actor, from, to, forced, plus ``details``; ``policy`` too for a policy other than default).

    ``run`` (a training run's uid): the version is also a checkpoint of that run, recorded in
    this transaction by the effect of ``PolicyPublished`` (curation/services/lineage.py);
    its record is ``pv.checkpoint``. A run the caller may not see is NotFound naming
    ``run``, and nothing is written."""
    if version < 0:
        raise InvalidInput("version must be >= 0", field="version")
    policy_check_name(policy, field="policy")
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_SWITCH_LOCK])
    pol = _policy_locked(policy, sources=sources, source_id=source_id)
    was = pol.current_version
    now = timezone.now()
    if current and version != was and not force:
        _check_step(was, version)
        if sources is not None:  # admins and operators are trusted with the rate; keys are not
            _check_window(pol, was, version, now)
    pv, _ = PolicyVersion.objects.get_or_create(version=version)
    if metadata is not None:
        pv.metadata = metadata
        pv.save(update_fields=["metadata"])
    if current and version != was:
        pol.current_version = version
        pol.save(update_fields=["current_version", "window_started_at", "window_advance"])
        audit_record(
            action=AuditEvent.Action.POLICY_CURRENT,
            target=str(version) if pol.name == Policy.DEFAULT else f"{pol.name}:{version}",
            actor=actor,
            details={
                **(details or {}),
                **({} if pol.name == Policy.DEFAULT else {"policy": pol.name}),
                "from": was,
                "to": version,
                "forced": bool(force),
            },
        )
    if pol.name == Policy.DEFAULT and current and not pv.is_current:
        # The default policy's current version is also PolicyVersion.is_current (what the
        # overview, stats and the formats' fallback read).
        PolicyVersion.objects.filter(is_current=True).update(is_current=False)
        PolicyVersion.objects.filter(version=version).update(is_current=True)
        pv.is_current = True
    pv.checkpoint = None  # type: ignore[attr-defined]
    if run is not None:
        event = PolicyPublished(
            run=run,
            version=version,
            policy=pol.name,
            metadata=metadata,
            source_id=source_id,
            sources=sources,
        )
        emit(event)
        if not event.recorded:  # no effect knew the run
            raise NotFound(f"run {run!r} does not exist", field="run")
        pv.checkpoint = event.recorded  # type: ignore[attr-defined]
    pv.policy = pol.name  # type: ignore[attr-defined]  # for policy_version_render
    pv.policy_current = pol.current_version == version  # type: ignore[attr-defined]
    return pv


def policy_check_name(name: Any, *, field: str) -> None:
    """InvalidInput naming ``field`` unless ``name`` is a policy name: 1-64 letters, digits,
    ``-``, ``_`` or ``.``."""
    if not isinstance(name, str) or not _POLICY_NAME.fullmatch(name):
        raise InvalidInput("a policy name is 1-64 letters, digits, '-', '_' or '.'", field=field)


def _policy_locked(name: str, *, sources: Sources, source_id: int | None) -> Policy:
    """The policy ``name``, locked, created (and owned by ``source_id``) on first sight;
    NotFound when others own it. An unowned policy becomes ``source_id``'s."""
    Policy.objects.get_or_create(
        name=name,
        defaults={
            "current_version": PolicyVersion.objects.filter(is_current=True)
            .values_list("version", flat=True)
            .first()
            if name == Policy.DEFAULT
            else None
        },
    )
    pol = Policy.objects.select_for_update().get(name=name)
    if sources is not None:
        owners = set(PolicyOwner.objects.filter(policy=pol).values_list("source_id", flat=True))
        if owners and not owners & set(sources):
            raise NotFound(f"policy {name!r} does not exist for this API key's sources", field="policy")
        if not owners and source_id is not None:
            PolicyOwner.objects.create(policy=pol, source_id=source_id)
    return pol


def _check_window(pol: Policy, was: int | None, version: int, now) -> None:
    """Bound the versions ``pol`` advances per minute (fixed window, under the row lock);
    records this move in the window (saved with the policy)."""
    limit = getattr(settings, "CLAW_POLICY_MAX_ADVANCE_PER_MINUTE", None)
    if limit is None:
        limit = settings.CLAW_POLICY_MAX_STEP
    if pol.window_started_at is None or now - pol.window_started_at >= WINDOW:
        pol.window_started_at, pol.window_advance = now, 0
    advance = version - (was if was is not None else 0)
    if pol.window_advance + advance > limit:
        retry = max(1, int((pol.window_started_at + WINDOW - now).total_seconds() + 0.999))
        raise PolicyRateLimited(
            f"policy {pol.name!r} moved {pol.window_advance} versions in the last minute; {advance} more "
            f"is over CLAW_POLICY_MAX_ADVANCE_PER_MINUTE={limit}: retry in {retry} s",
            field="version",
        )
    pol.window_advance += advance


def _check_step(was: int | None, version: int) -> None:
    step = settings.CLAW_POLICY_MAX_STEP
    base = was if was is not None else 0
    if was is not None and version < was:
        raise Conflict(
            f"version {version} is behind the current version {was}: moving back needs "
            '"force": true (admins only)',
            field="version",
        )
    if version - base > step:
        raise Conflict(
            f"version {version} is more than CLAW_POLICY_MAX_STEP={step} above "
            f"{'the current version ' + str(was) if was is not None else '0 (no current version yet)'}: "
            'a jump this far needs "force": true (admins only)',
            field="version",
        )
