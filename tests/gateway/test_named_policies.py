"""Named policies (pool.models.Policy, pool/services/policy.py): a policy key moves only the
policies its sources own, a dataset follows one policy's freshness (filters.policy), and a
policy's current version moves at most CLAW_POLICY_MAX_ADVANCE_PER_MINUTE within a minute.
Without a policy name everything is as before: the policy is ``default``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from curation.selectors.specs import dataset_admitted
from curation.specs import spec_parse
from pool.ingest.pipeline import steps_ingest
from pool.models import Policy, PolicyOwner, PolicyVersion, Scope
from pool.services.api_keys import api_key_create
from pool.services.groups import group_upsert
from tests.conftest import client_for
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def current(name: str = "default") -> int | None:
    if name == "default":
        return PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    return Policy.objects.filter(name=name).values_list("current_version", flat=True).first()


@pytest.fixture
def callers():
    def key(name: str, *scopes: str):
        return client_for(api_key_create(name=name, scopes=list(scopes), source_name=f"src-{name}")[1])

    return {
        "a": key("a", Scope.CONSUME, Scope.POLICY),
        "b": key("b", Scope.CONSUME, Scope.POLICY),
        "admin": key("root", Scope.ADMIN),
    }


def post(c, **body):
    return c.post("/api/v1/policy-versions", body, format="json")


def test_a_policy_key_moves_only_its_sources_policies(callers):
    # (who, body, status, error param, default's current after, team-b's current after)
    table = [
        ("a", {"version": 1}, 200, None, 1, None),  # unowned default: a's source owns it now
        ("b", {"version": 2}, 404, "policy", 1, None),  # not b's: as if it did not exist
        ("b", {"version": 2, "policy": "default"}, 404, "policy", 1, None),
        ("b", {"version": 5, "policy": "team-b"}, 200, None, 1, 5),  # a new policy: b's
        ("a", {"version": 6, "policy": "team-b"}, 404, "policy", 1, 5),
        ("b", {"version": 6, "policy": "team-b"}, 200, None, 1, 6),
        ("admin", {"version": 3}, 200, None, 3, 6),  # admins move any policy
        ("admin", {"version": 7, "policy": "team-b"}, 200, None, 3, 7),
        ("a", {"version": 4, "policy": "bad name!"}, 400, "policy", 3, 7),
        ("a", {"version": 4, "policy": 7}, 400, "policy", 3, 7),
        ("a", {"version": 4, "policy": ""}, 400, "policy", 3, 7),
    ]
    for who, body, status, param, default_after, b_after in table:
        resp = post(callers[who], **body)
        assert resp.status_code == status, (who, body, resp.content)
        if param is not None:
            assert resp.json()["error"]["param"] == param, (who, body, resp.content)
        elif "policy" in body:
            assert resp.json() == {
                "version": body["version"], "is_current": True, "metadata": {}, "policy": body["policy"],
            }  # fmt: skip
        else:  # the default's answer is as it always was
            assert resp.json() == {"version": body["version"], "is_current": True, "metadata": {}}
        assert (current(), current("team-b")) == (default_after, b_after), (who, body)
    owners = {
        p: sorted(PolicyOwner.objects.filter(policy__name=p).values_list("source__name", flat=True))
        for p in ("default", "team-b")
    }
    assert owners == {"default": ["src-a"], "team-b": ["src-b"]}


def test_moves_are_bounded_per_minute_as_per_call(callers, settings):
    settings.CLAW_POLICY_MAX_STEP = 10
    settings.CLAW_POLICY_MAX_ADVANCE_PER_MINUTE = 15
    a = callers["a"]
    # (who, version, status, error code, current after)
    table = [
        ("a", 10, 200, None, 10),
        ("a", 15, 200, None, 15),  # 15 within the minute: the bound
        ("a", 16, 429, "policy_rate_limited", 15),
        ("a", 27, 409, "conflict", 15),  # over the per-call bound: as before
        ("admin", 20, 200, None, 20),  # admins are not counted nor bounded by the rate
        ("a", 21, 429, "policy_rate_limited", 20),
    ]
    for who, version, status, code, after in table:
        resp = post(callers[who], version=version)
        assert resp.status_code == status, (who, version, resp.content)
        if code is not None:
            err = resp.json()["error"]
            assert (err["code"], err["param"]) == (code, "version"), err
            if status == 429:
                assert "CLAW_POLICY_MAX_ADVANCE_PER_MINUTE=15" in err["message"]
        assert current() == after
    # when: the minute has passed (its start moved back, not waited for)
    Policy.objects.filter(name="default").update(window_started_at=timezone.now() - timedelta(seconds=61))
    # then: the key may move it again, by its per-call bound
    assert post(a, version=30).status_code == 200 and current() == 30


def test_a_dataset_follows_its_policys_freshness(callers):
    # given: a ready group rolled out under version 5; default at 9, team-b at 5
    assert post(callers["admin"], version=9).status_code == 200
    assert post(callers["b"], version=5, policy="team-b").status_code == 200
    group_upsert(uid="g", expected_rollouts=1)
    steps_ingest(
        steps=[
            step_in("t", 0, prompt=[1], response=[2], group="g", reward=1.0, is_last=True, policy_version=5)
        ]
    )
    specs = {
        "default": {"filters": {"max_staleness": 0}},
        "team-b": {"filters": {"max_staleness": 0, "policy": "team-b"}},
        "unknown policy": {"filters": {"max_staleness": 0, "policy": "nobody"}},  # no current: all
    }

    def admitted() -> dict[str, int]:
        return {name: len(dataset_admitted(spec_parse(spec))) for name, spec in specs.items()}

    # then: the default dataset finds it stale, team-b's fresh
    assert admitted() == {"default": 0, "team-b": 1, "unknown policy": 1}
    # when: default moves on, nothing changes for team-b; when team-b moves, it is stale there
    assert post(callers["admin"], version=10).status_code == 200
    assert admitted() == {"default": 0, "team-b": 1, "unknown policy": 1}
    assert post(callers["b"], version=6, policy="team-b").status_code == 200
    assert admitted() == {"default": 0, "team-b": 0, "unknown policy": 1}
    # and: a bad policy name in a spec is a 400 naming the field
    resp = callers["admin"].post(
        "/api/v1/datasets", {"name": "x", "filters": {"policy": "no spaces"}}, format="json"
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "filters.policy", resp.content
