"""Trajectory capabilities: the tokens of capability URLs (see TrajectoryCapability).

A capability URL carries a fresh random token in its path (``.../c/<token>/<trajectory>/...``)
so that an agent needs nothing but its base URL: no API key, no header. The token is
scoped to one trajectory and to the source of the key that issued it; the gateway lets it
record that trajectory's steps, register and complete it, and nothing else.

Verification costs one indexed read per call and is not cached: a completed trajectory's
token must stop working at once, in every process.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..errors import Conflict, PoolError
from ..models import Channel, Scope, Trajectory, TrajectoryCapability
from ..tenancy import OWN
from .api_keys import VerifiedKey
from .trajectories import trajectory_create, trajectory_register


class CapabilityRefused(PoolError):
    """A token that is unknown, expired, or whose trajectory or issuing key has ended."""

    status_code = 401
    code = "invalid_capability"


class CapabilityMisused(PoolError):
    """A live token used for a trajectory other than its own."""

    status_code = 403
    code = "permission_denied"


@transaction.atomic
def trajectory_capability_issue(*, trajectory: Trajectory, api_key_id: int) -> str:
    """Mint a token for ``trajectory`` on behalf of the key ``api_key_id`` and return it in
    clear (it is stored only hashed). It expires CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS from
    now. Not idempotent: every call mints a new, independent token. Raises Conflict when the
    trajectory is not running (a token for it would be refused at once)."""
    if trajectory.status != Trajectory.Status.RUNNING:
        raise Conflict(
            f"trajectory {trajectory.uid!r} is {trajectory.status}; it takes no new calls", field="uid"
        )
    clear = secrets.token_urlsafe(24)  # 192 bits
    TrajectoryCapability.objects.create(
        trajectory=trajectory,
        api_key_id=api_key_id,
        token_hash=_hash(clear),
        expires_at=timezone.now() + timedelta(seconds=settings.CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS),
    )
    return clear


@transaction.atomic
def trajectory_init(
    *,
    api_key_id: int,
    source_id: int,
    prompt_group_uid: str | None = None,
    channel: str | None = None,
    metadata: dict | None = None,
    sources: object = OWN,
) -> tuple[Trajectory, str]:
    """Claw-R1's ``init_trajectory``: open a new trajectory (a fresh uid) and mint its token.

    No prompt group is bound unless ``prompt_group_uid`` is given: the first call that names
    one (register or chat, from its base URL) binds it. Not idempotent (a new trajectory each
    call). Raises InvalidInput for a bad channel or ``metadata.policy_version``; nothing is
    written then."""
    traj = trajectory_register(
        uid=uuid.uuid4().hex,
        prompt_group_uid=prompt_group_uid,
        channel=channel,
        metadata=metadata,
        source_id=source_id,
        sources=sources,
    )
    return traj, trajectory_capability_issue(trajectory=traj, api_key_id=api_key_id)


@transaction.atomic
def trajectory_create_with_capability(
    *,
    uid: str,
    api_key_id: int | None,
    prompt_group_uid: str | None = None,
    channel: str = Channel.TRAIN,
    metadata: dict | None = None,
    policy_version: int | None = None,
    source_id: int | None = None,
    sources: object = OWN,
) -> tuple[Trajectory, bool, str | None]:
    """``trajectory_create`` (idempotent by uid, Conflict for another group) plus a token
    for the new or existing trajectory: (trajectory, created, token). The token is None when
    there is no issuing key (an operator's session) or the trajectory is no longer running;
    otherwise each call mints a new one."""
    traj, created = trajectory_create(
        uid=uid,
        prompt_group_uid=prompt_group_uid,
        channel=channel,
        metadata=metadata,
        policy_version=policy_version,
        source_id=source_id,
        sources=sources,
    )
    if api_key_id is None or traj.status != Trajectory.Status.RUNNING:
        return traj, created, None
    return traj, created, trajectory_capability_issue(trajectory=traj, api_key_id=api_key_id)


def trajectory_capability_verify(*, token: str, trajectory_uid: str) -> VerifiedKey:
    """What ``token`` may do for a call on ``trajectory_uid``: the issuing key's identity
    with the ingest scope only. Read-only (one indexed query, not cached). Raises
    CapabilityRefused (401) for an unknown or expired token, an ended trajectory, or a
    revoked issuing key; CapabilityMisused (403) when the token belongs to another
    trajectory."""
    row = (
        TrajectoryCapability.objects.filter(token_hash=_hash(token))
        .values_list(
            "trajectory__uid",
            "trajectory__status",
            "expires_at",
            "api_key_id",
            "api_key__revoked_at",
            "api_key__scopes",
            "api_key__source_id",
            "api_key__source__name",
            "trajectory__source_id",
        )
        .first()
    )
    if row is None:
        raise CapabilityRefused("invalid trajectory token: this capability URL is not known")
    own_uid, status, expires_at, key_id, revoked_at, scopes, source_id, source_name, traj_source = row
    if own_uid != trajectory_uid:
        raise CapabilityMisused(
            "this capability URL belongs to another trajectory; it authorises only its own",
            field="trajectory_uid",
        )
    if revoked_at is not None or not (Scope.ADMIN in scopes or Scope.INGEST in scopes):
        raise CapabilityRefused(
            "the API key that issued this capability URL was revoked or lost its ingest scope"
        )
    if expires_at <= timezone.now():
        raise CapabilityRefused(
            f"this capability URL expired at {expires_at.isoformat()}; open a new trajectory "
            "(tokens live CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS)"
        )
    if status != Trajectory.Status.RUNNING:
        raise CapabilityRefused(f"trajectory {own_uid!r} is {status}; its capability URL no longer works")
    # It writes its own trajectory only, whichever of the issuing key's sources holds it.
    return VerifiedKey(
        key_id=key_id,
        source_id=source_id,
        source_name=source_name,
        scopes=frozenset({Scope.INGEST}),
        extra_source_ids=frozenset({traj_source} - {None}),
    )


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
