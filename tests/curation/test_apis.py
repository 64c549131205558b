"""/api/v1/datasets, /api/v1/datasets/preview, /api/v1/labels and
/api/v1/trajectory-completions: behaviour and bad input named by field (who may call them:
tests/gateway/test_auth_scopes.py)."""

from __future__ import annotations

import pytest

from curation.models import Dataset, LabelEvent, StepTag
from pool.models import RewardEvent, Scope, Step, Trajectory
from tests.conftest import client_for, make_step, post_steps

pytestmark = pytest.mark.django_db


@pytest.fixture
def curator(make_key):
    return client_for(make_key(Scope.ADMIN, name="curator"))


def finished(agent, traj: str, n: int = 2, group: str | None = None):
    steps = [make_step(traj, i, group=group, reward=1.0, is_last=i == n - 1) for i in range(n)]
    assert post_steps(agent, steps).status_code == 201


def test_create_preview_edit_and_read_a_dataset(agent, curator, reader):
    finished(agent, "a")
    finished(agent, "b")
    # given a dataset over every ready step
    resp = curator.post("/api/v1/datasets", {"name": "all", "filters": {}}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["version"] == 1 and resp.json()["filters"]["exclude_labels"] == [
        "rejected",
        "quarantined",
    ]
    # its preview counts the four ready steps
    preview = reader.get("/api/v1/datasets/all/preview").json()
    assert (preview["steps"], preview["trajectories"], preview["version"]) == (4, 2, 1)
    # an edit adds version 2; version 1 stays as it was
    resp = curator.patch("/api/v1/datasets/all", {"filters": {"channel": "val"}}, format="json")
    assert resp.status_code == 200, resp.content
    body = reader.get("/api/v1/datasets/all").json()
    assert [v["version"] for v in body["versions"]] == [1, 2]
    assert body["versions"][0]["spec"]["filters"]["channel"] is None
    assert body["filters"]["channel"] == "val"
    assert reader.get("/api/v1/datasets/all/preview").json()["steps"] == 0
    # an unsaved spec previews too
    resp = reader.post(
        "/api/v1/datasets/preview", {"filters": {"exclude_flags": ["missing_logprobs"]}}, format="json"
    )
    assert resp.status_code == 200 and resp.json()["steps"] == 0  # make_step sends no logprobs


def test_a_patch_keeps_every_part_it_does_not_name(curator, reader):
    # given: a dataset with serving rules and a reward assignment
    spec = {
        "name": "kept",
        "filters": {"channel": "train"},
        "grouping": {"reward_assignment": "last_step"},
        "serving": {"stale_after": 2, "capacity": 50},
    }
    assert curator.post("/api/v1/datasets", spec, format="json").status_code == 201
    # when: one part at a time is patched
    assert (
        curator.patch("/api/v1/datasets/kept", {"filters": {"channel": "val"}}, format="json").status_code
        == 200
    )
    v2 = reader.get("/api/v1/datasets/kept").json()
    assert (
        curator.patch("/api/v1/datasets/kept", {"serving": {"stale_after": 5}}, format="json").status_code
        == 200
    )
    v3 = reader.get("/api/v1/datasets/kept").json()
    # then: a filter edit kept the serving rules and the grouping; a serving edit made a version
    assert v2["version"] == 2 and v2["filters"]["channel"] == "val"
    assert (v2["serving"]["stale_after"], v2["serving"]["capacity"]) == (2, 50)
    assert v2["grouping"]["reward_assignment"] == "last_step"
    assert v3["version"] == 3 and v3["serving"]["stale_after"] == 5 and v3["serving"]["capacity"] is None
    assert (v3["filters"]["channel"], v3["grouping"]["reward_assignment"]) == ("val", "last_step")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "filters": {"max_staleness": -1}}, "filters.max_staleness"),
        ({"name": "x", "filters": {"exclude_flags": ["shiny"]}}, "filters.exclude_flags[0]"),
        ({"name": "x", "filters": {"colour": "red"}}, "filters.colour"),
        ({"name": "x", "grouping": {"short_groups": "keep"}}, "grouping.short_groups"),
        ({"name": "bad name!"}, "name"),
        ({"name": "x", "extra": 1}, "extra"),
    ],
)
def test_a_bad_dataset_is_a_400_naming_the_field_and_writes_nothing(curator, body, field):
    resp = curator.post("/api/v1/datasets", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == field
    assert Dataset.objects.count() == 0


def test_a_duplicate_dataset_name_is_a_409(curator):
    assert curator.post("/api/v1/datasets", {"name": "d"}, format="json").status_code == 201
    assert curator.post("/api/v1/datasets", {"name": "d"}, format="json").status_code == 409


def test_labels_by_step_or_trajectory_are_audited(agent, curator):
    finished(agent, "a")
    resp = curator.post(
        "/api/v1/labels",
        {"trajectory_uids": ["a"], "label": "rejected", "tags_add": ["bad-tool"]},
        format="json",
    )
    assert resp.status_code == 200 and resp.json() == {"changed": 2}
    assert set(Step.objects.values_list("label", flat=True)) == {"rejected"}
    assert StepTag.objects.filter(tag="bad-tool").count() == 2
    ev = LabelEvent.objects.first()
    assert ev.actor.startswith("key:") and ev.changes == {
        "label": ["", "rejected"],
        "tags_added": ["bad-tool"],
    }
    # repeating it changes nothing and audits nothing
    assert curator.post(
        "/api/v1/labels", {"trajectory_uids": ["a"], "label": "rejected"}, format="json"
    ).json() == {"changed": 0}
    resp = curator.post("/api/v1/labels", {"step_uids": ["a-s0", "nope"], "label": "accepted"}, format="json")
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "step_uids[1]"
    resp = curator.post("/api/v1/labels", {"step_uids": ["a-s0"], "label": "great"}, format="json")
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "label"
    assert LabelEvent.objects.count() == 2


def test_trajectory_completions_end_many_at_once(agent):
    for t in ("a", "b"):
        assert post_steps(agent, [make_step(t, 0, group=None, reward=1.0)]).status_code == 201
    resp = agent.post(
        "/api/v1/trajectory-completions",
        {"completions": [{"uid": "a", "reward": 0.5}, {"uid": "b", "status": "failed"}]},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    assert dict(Trajectory.objects.values_list("uid", "status")) == {"a": "completed", "b": "failed"}
    assert RewardEvent.objects.filter(trajectory__uid="a", new_reward=0.5).count() == 1
    assert Step.objects.get(uid="a-s0").readiness == 15
    # all or none: one unknown uid writes nothing
    resp = agent.post(
        "/api/v1/trajectory-completions", {"completions": [{"uid": "a"}, {"uid": "zz"}]}, format="json"
    )
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "completions[1].uid"
