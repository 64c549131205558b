"""Trajectory capabilities (pool/services/capabilities.py): minting, what a token is scoped
to, when it stops working, how it is stored."""

from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

from pool.errors import Conflict, InvalidInput
from pool.models import ApiKey, Scope, Trajectory, TrajectoryCapability
from pool.services.api_keys import api_key_create
from pool.services.capabilities import (
    CapabilityMisused,
    CapabilityRefused,
    trajectory_capability_issue,
    trajectory_capability_verify,
    trajectory_create_with_capability,
    trajectory_init,
)
from pool.services.trajectories import trajectory_complete, trajectory_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def issuer() -> ApiKey:
    key, _ = api_key_create(name="issuer", scopes=[Scope.INGEST])
    return key


def opened(issuer: ApiKey, **kw) -> tuple[Trajectory, str]:
    return trajectory_init(api_key_id=issuer.id, source_id=issuer.source_id, **kw)


def test_init_opens_a_trajectory_without_a_group_and_a_token_for_it(issuer):
    # when
    traj, token = opened(issuer, channel="val", metadata={"policy_version": 2})

    # then: a running trajectory of the key's source, no group bound, a 192-bit token
    traj.refresh_from_db()
    assert (traj.status, traj.group_id, traj.source_id, traj.channel) == (
        "running",
        None,
        issuer.source_id,
        "val",
    )
    assert traj.policy_version_id == 2
    assert len(token) >= 32
    # and: the token is stored only as its SHA-256, with the configured lifetime
    cap = TrajectoryCapability.objects.get(trajectory=traj)
    assert cap.token_hash == hashlib.sha256(token.encode()).hexdigest()
    assert not TrajectoryCapability.objects.filter(token_hash=token).exists()
    assert abs((cap.expires_at - cap.created_at) - timedelta(hours=24)) < timedelta(seconds=5)
    # and: it verifies as the issuing key's source, with the ingest scope only
    grant = trajectory_capability_verify(token=token, trajectory_uid=traj.uid)
    assert (grant.key_id, grant.source_id, grant.scopes) == (issuer.id, issuer.source_id, {Scope.INGEST})


def test_init_with_a_prompt_uid_binds_it_and_bad_input_writes_nothing(issuer):
    traj, _ = opened(issuer, prompt_group_uid="g-given")
    assert traj.group.uid == "g-given"
    with pytest.raises(InvalidInput):
        opened(issuer, channel="nope")
    assert Trajectory.objects.count() == TrajectoryCapability.objects.count() == 1


def test_a_token_is_scoped_to_its_own_trajectory(issuer):
    (a, token), (b, _) = opened(issuer), opened(issuer)
    assert trajectory_capability_verify(token=token, trajectory_uid=a.uid).key_id == issuer.id
    with pytest.raises(CapabilityMisused):
        trajectory_capability_verify(token=token, trajectory_uid=b.uid)
    with pytest.raises(CapabilityMisused):
        trajectory_capability_verify(token=token, trajectory_uid="does-not-exist")


@pytest.mark.parametrize("status", ["completed", "failed", "abandoned"])
def test_a_token_stops_working_when_its_trajectory_ends(issuer, status):
    traj, token = opened(issuer)
    trajectory_complete(uid=traj.uid, status=status)
    with pytest.raises(CapabilityRefused, match=status):
        trajectory_capability_verify(token=token, trajectory_uid=traj.uid)
    # and: no new token is minted for it
    with pytest.raises(Conflict):
        trajectory_capability_issue(trajectory=Trajectory.objects.get(uid=traj.uid), api_key_id=issuer.id)


def test_a_token_expires_after_the_configured_lifetime(issuer, settings):
    # given: a lifetime of zero seconds, so a new token is already expired (no waiting)
    settings.CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS = 0
    traj, token = opened(issuer)

    # then
    with pytest.raises(CapabilityRefused, match="expired"):
        trajectory_capability_verify(token=token, trajectory_uid=traj.uid)


def test_a_token_dies_with_its_issuing_key(issuer):
    traj, token = opened(issuer)
    ApiKey.objects.filter(id=issuer.id).update(scopes=[Scope.READ])
    with pytest.raises(CapabilityRefused, match="revoked or lost its ingest scope"):
        trajectory_capability_verify(token=token, trajectory_uid=traj.uid)
    ApiKey.objects.filter(id=issuer.id).update(scopes=[Scope.INGEST], revoked_at=timezone.now())
    with pytest.raises(CapabilityRefused, match="revoked"):
        trajectory_capability_verify(token=token, trajectory_uid=traj.uid)
    issuer.delete()
    with pytest.raises(CapabilityRefused, match="not known"):
        trajectory_capability_verify(token=token, trajectory_uid=traj.uid)


def test_an_unknown_token_is_refused(issuer):
    traj, token = opened(issuer)
    with pytest.raises(CapabilityRefused, match="not known"):
        trajectory_capability_verify(
            token=token[:-1] + ("A" if token[-1] != "A" else "B"), trajectory_uid=traj.uid
        )


def test_every_call_mints_a_new_independent_token(issuer):
    traj, first = opened(issuer)
    second = trajectory_capability_issue(trajectory=traj, api_key_id=issuer.id)
    assert first != second
    for token in (first, second):
        assert (
            trajectory_capability_verify(token=token, trajectory_uid=traj.uid).source_id == issuer.source_id
        )


def test_create_with_capability_is_trajectory_create_plus_a_token(issuer):
    # when: created, then created again (idempotent), then once more after it ended
    traj, created, token = trajectory_create_with_capability(
        uid="cw", prompt_group_uid="g", api_key_id=issuer.id, source_id=issuer.source_id
    )
    again, created_again, token_again = trajectory_create_with_capability(
        uid="cw", api_key_id=issuer.id, source_id=issuer.source_id
    )
    trajectory_complete(uid="cw")
    _, _, token_after = trajectory_create_with_capability(uid="cw", api_key_id=issuer.id)

    # then
    assert (created, created_again, again.id) == (True, False, traj.id)
    assert token and token_again and token != token_again and token_after is None
    # and: without an issuing key there is no token; a conflict writes none
    assert trajectory_create_with_capability(uid="cw2", api_key_id=None)[2] is None
    with pytest.raises(Conflict):
        trajectory_create_with_capability(uid="cw", prompt_group_uid="other", api_key_id=issuer.id)
    assert TrajectoryCapability.objects.count() == 2
    assert trajectory_create(uid="cw")[1] is False


def test_the_admin_shows_tokens_without_their_secret(issuer, operator, client):
    # given: a token, and an operator signed in to the admin
    traj, token = opened(issuer)
    cap = TrajectoryCapability.objects.get(trajectory=traj)
    client.force_login(operator)

    # when
    listing = client.get("/admin/pool/trajectorycapability/")
    detail = client.get(f"/admin/pool/trajectorycapability/{cap.id}/change/")

    # then: the trajectory is named; neither the token nor its hash is shown
    assert listing.status_code == detail.status_code == 200
    for page in (listing.content.decode(), detail.content.decode()):
        assert traj.uid in page and token not in page and cap.token_hash not in page
    assert client.get("/admin/pool/trajectorycapability/add/").status_code == 403
