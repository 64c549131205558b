"""Who may move the current policy version, and how far (POST /api/v1/policy-versions).

README: "Policy versions: setting the current policy version needs the policy scope (trainer keys hold
consume + policy; an ingest or consume key alone gets 403). It moves forward by at most
CLAW_POLICY_MAX_STEP (default 1000) over the current one (over 0 when there is none); a
jump further, or any move back, is a 409 naming version unless an admin (admin key or
operator) sends "force": true (anyone else: 403 naming force). Every change of the current
version is an audit row (policy.current: who, from, to, forced). Registering a version
without making it current ("current": false) is not bounded." """

from __future__ import annotations

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from pool.models import AuditEvent, PolicyVersion, Scope
from pool.services.policy import policy_version_set
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

START = 10
INT64_MAX = 2**63 - 1


def current() -> int | None:
    return PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()


def audits() -> list[dict]:
    return [
        {"actor": a.actor, **a.details}
        for a in AuditEvent.objects.filter(action=AuditEvent.Action.POLICY_CURRENT).order_by("id")
    ]


ACTORS = ("ingest", "consume", "policy", "admin", "staff")


def actor_client(actor: str, make_key, django_user_model) -> tuple[APIClient, str]:
    """The client and the audit actor it is recorded as."""
    if actor == "staff":
        client = APIClient()
        client.force_login(django_user_model.objects.create_superuser("op", "op@example.com", "pw"))
        return client, "user:op"
    scopes = {"policy": (Scope.CONSUME, Scope.POLICY)}.get(actor, (actor,))
    return client_for(make_key(*scopes, name=f"k-{actor}")), f"key:k-{actor}"


# change -> body (from START)
CHANGES = {
    "forward": {"version": START + 1},
    "forward to the bound": {"version": START + 1000},
    "beyond the bound": {"version": START + 1001},
    "backward": {"version": START - 1},
    "to int64 max": {"version": INT64_MAX},
    "beyond the bound, forced": {"version": INT64_MAX, "force": True},
    "backward, forced": {"version": START - 1, "force": True},
    "forward, forced": {"version": START + 1, "force": True},
}
# (actor kind, change) -> (status, error param, current version after)
ADMIN = {
    "forward": (200, None, START + 1),
    "forward to the bound": (200, None, START + 1000),
    "beyond the bound": (409, "version", START),
    "backward": (409, "version", START),
    "to int64 max": (409, "version", START),
    "beyond the bound, forced": (200, None, INT64_MAX),
    "backward, forced": (200, None, START - 1),
    "forward, forced": (200, None, START + 1),
}
POLICY = {
    **{k: v for k, v in ADMIN.items() if "forced" not in k},
    # force is an admin's: a policy key's forced change is refused whole, even a small step
    "beyond the bound, forced": (403, "force", START),
    "backward, forced": (403, "force", START),
    "forward, forced": (403, "force", START),
}
NO_SCOPE = dict.fromkeys(CHANGES, (403, None, START))
EXPECTED = {"ingest": NO_SCOPE, "consume": NO_SCOPE, "policy": POLICY, "admin": ADMIN, "staff": ADMIN}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("actor", ACTORS)
def test_policy_matrix(make_key, django_user_model, actor, change):
    # given version START current (one audit row) and a caller of this kind
    assert settings.CLAW_POLICY_MAX_STEP == 1000
    policy_version_set(version=START, actor="setup")
    client, recorded_as = actor_client(actor, make_key, django_user_model)
    body = CHANGES[change]
    status, param, after = EXPECTED[actor][change]
    # when it posts the change
    resp = client.post("/api/v1/policy-versions", body, format="json")
    # then the answer, the current version and the audit rows are as expected
    assert resp.status_code == status, resp.content
    if status == 200:
        assert resp.json() == {"version": after, "is_current": True, "metadata": {}}
    else:
        error = resp.json()["error"]
        assert error["param"] == param, error
        assert error["type"] == {403: "permission_error", 409: "conflict_error"}[status]
    assert current() == after
    expected_audits = [{"actor": "setup", "from": None, "to": START, "forced": False}]
    if after != START:
        row = {"actor": recorded_as, "from": START, "to": after, "forced": bool(body.get("force"))}
        if actor != "staff":
            row["source"] = f"k-{actor}"
        expected_audits.append(row)
    got = audits()
    for a in got:
        a.pop("key_id", None)
    assert got == expected_audits
    if status != 200:  # a refused change registers nothing either
        assert set(PolicyVersion.objects.values_list("version", flat=True)) == {START}


@pytest.mark.parametrize(
    ("first", "status"),
    [(0, 200), (1000, 200), (1001, 409), (INT64_MAX, 409)],
)
def test_the_first_current_version_counts_from_zero(trainer_key, first, status):
    resp = client_for(trainer_key).post("/api/v1/policy-versions", {"version": first}, format="json")
    assert resp.status_code == status, resp.content
    assert current() == (first if status == 200 else None)
    assert len(audits()) == (1 if status == 200 else 0)


def test_the_bound_is_the_setting(trainer_key, settings):
    settings.CLAW_POLICY_MAX_STEP = 2
    trainer = client_for(trainer_key)
    assert trainer.post("/api/v1/policy-versions", {"version": 2}, format="json").status_code == 200
    assert trainer.post("/api/v1/policy-versions", {"version": 5}, format="json").status_code == 409
    assert trainer.post("/api/v1/policy-versions", {"version": 4}, format="json").status_code == 200
    assert current() == 4


@pytest.mark.parametrize(
    ("body", "audited"),
    [
        ({"version": START}, False),  # already current: no change, no audit row
        ({"version": START, "metadata": {"ckpt": "s10"}}, False),
        ({"version": INT64_MAX, "current": False}, False),  # registered, not current: no bound
    ],
)
def test_what_is_not_a_change_of_the_current_version(trainer_key, body, audited):
    policy_version_set(version=START, actor="setup")
    resp = client_for(trainer_key).post("/api/v1/policy-versions", body, format="json")
    assert resp.status_code == 200, resp.content
    assert current() == START
    assert len(audits()) == 1 + audited
