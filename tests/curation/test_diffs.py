"""What changed (curation/selectors/diffs.py, GET /api/v1/datasets/{name}/diff and
/api/v1/snapshots/{id}/diff): two dataset versions differ by the steps they admit; two
snapshots by their steps and, among the kept ones, by reward, quality flags and review.
Through the real API on a real database, compared with what was written."""

from __future__ import annotations

import pytest

from curation.services.datasets import dataset_create, dataset_update
from curation.services.labels import steps_label
from curation.services.snapshots import snapshot_build, snapshot_create
from pool.flags import Quality
from pool.models import Scope, Step
from pool.services.labels import steps_quality_flag_set
from tests.conftest import client_for
from tests.curation.test_consume import ready_group

pytestmark = pytest.mark.django_db


@pytest.fixture
def reader(make_key):
    return client_for(make_key(Scope.READ, name="diff-reader"))


def every(client, url):
    """Every listed result of a diff, following its next links."""
    out, body = [], None
    while url:
        body = client.get(url).json()
        out += body["results"]
        url = body["next"]
    return out, body


def test_two_versions_differ_by_the_steps_they_admit(reader):
    # given groups g0 (rewards 0, 1) and g1, a dataset of every ready step, then one of the
    # steps rewarded at least 0.5 served as steps
    g0, g1 = ready_group("g0"), ready_group("g1")
    dataset_create(name="d")
    dataset_update(name="d", spec={"filters": {"reward_min": 0.5}, "grouping": {"keep_groups_whole": False}})
    # when the versions are compared
    resp = reader.get("/api/v1/datasets/d/diff?from=1&to=2&side=removed&page_size=3")
    assert resp.status_code == 200, resp.content
    # then the rollouts rewarded 0 were removed (their steps; the r1 rollouts are kept)
    removed = [u for u in g0 + g1 if "-r0:" in u]
    assert resp.json()["counts"] == {"added": 0, "removed": 4, "kept": 4, "masked_changed": 0}
    listed, _ = every(reader, "/api/v1/datasets/d/diff?from=1&to=2&side=removed&page_size=3")
    assert [r["uid"] for r in listed] == removed
    assert listed[0]["masked"] == {"from": False, "to": None}
    kept, _ = every(reader, "/api/v1/datasets/d/diff?from=1&to=2&side=kept")
    assert sorted(r["uid"] for r in kept) == sorted(set(g0 + g1) - set(removed))
    # and the other way round, they are added
    back = reader.get("/api/v1/datasets/d/diff?from=2&to=1").json()
    assert back["counts"]["added"] == 4 and back["side"] == "added"


def test_two_snapshots_differ_by_steps_reward_flags_and_review(reader, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    g0 = ready_group("g0")
    dataset_create(name="d", spec={"filters": {"readiness": "any"}})
    first = snapshot_create(dataset="d")
    snapshot_build(snapshot_id=first.id)
    # when a step is flagged, another labelled, a third removed and a new group arrives
    ids = dict(Step.objects.filter(uid__in=g0).values_list("uid", "id"))
    steps_quality_flag_set(step_ids=[ids[g0[0]]], flag=int(Quality.POLICY_MISMATCH))
    steps_label(step_ids=[ids[g0[1]]], label="accepted", tags_add=["good"], actor="op")
    Step.objects.filter(uid=g0[3]).delete()
    g1 = ready_group("g1")
    second = snapshot_create(dataset="d")
    snapshot_build(snapshot_id=second.id)
    url = f"/api/v1/snapshots/{first.id}/diff?to={second.id}"
    # then the diff counts and names each change, field by field
    body = reader.get(url).json()
    assert body["counts"] == {
        "added": 4,
        "removed": 1,
        "kept": 3,
        "changed": 2,
        "reward_changed": 0,
        "quality_flags_changed": 1,
        "review_changed": 1,
    }
    assert sorted(r["uid"] for r in body["results"]) == sorted(g1)
    assert [r["uid"] for r in every(reader, url + "&side=removed")[0]] == [g0[3]]
    changed, _ = every(reader, url + "&side=changed&page_size=1")
    had = ["missing_logprobs", "duplicate"]  # ready_group's steps have no logprobs, one response
    assert changed == [
        {"uid": g0[0], "changed": ["quality_flags"], "quality_flags": [had, [*had, "policy_mismatch"]]},
        {
            "uid": g0[1],
            "changed": ["review"],
            "label": [None, "accepted"],  # as the snapshot holds it: null for none
            "tags": [[], ["good"]],
            "feedback": [[], []],
        },
    ]


def test_a_diff_names_its_bad_parameter(reader, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    dataset_create(name="d")
    snap = snapshot_create(dataset="d")
    for url, field, status in (
        ("/api/v1/datasets/d/diff?from=1", "to", 400),
        ("/api/v1/datasets/d/diff?from=1&to=9", "to", 404),
        ("/api/v1/datasets/d/diff?from=1&to=1&side=sideways", "side", 400),
        ("/api/v1/datasets/nope/diff?from=1&to=1", "name", 404),
        (f"/api/v1/snapshots/{snap.id}/diff?to=x", "to", 400),
        (f"/api/v1/snapshots/{snap.id}/diff?to={snap.id}", "snapshot", 409),
    ):
        resp = reader.get(url)
        assert (resp.status_code, resp.json()["error"]["param"]) == (status, field), url
