"""Serving rules of a dataset (curation/specs.py Serving): freshness (``stale_after``) and
capacity drop units for a consumer when they are offered, never serve them to it, and count
every drop with its reason (``GET /api/v1/consumers/{name}``, the manifest's ``dropped``)."""

from __future__ import annotations

import pytest

from curation.models import Skip
from curation.services.datasets import dataset_create
from pool.models import Scope, Step, Trajectory
from pool.services.policy import policy_version_set
from tests.conftest import client_for
from tests.curation.test_consume import pull, ready_group

pytestmark = pytest.mark.django_db


@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


def groups_of(body) -> list[str]:
    seen: list[str] = []
    for s in body["batch"]["steps"]:
        if s["prompt_group_uid"] not in seen:
            seen.append(s["prompt_group_uid"])
    return seen


@pytest.fixture
def curator(make_key):
    return client_for(make_key(Scope.ADMIN, name="curator"))


def status(trainer, consumer="c1") -> dict:
    resp = trainer.get(f"/api/v1/consumers/{consumer}")
    assert resp.status_code == 200, resp.content
    [entry] = resp.json()["datasets"]
    return entry


def test_stale_units_are_dropped_when_offered_and_counted(trainer):
    """README: "Serving rules (optional, per dataset: "serving": {"stale_after": 2,
    "capacity": 500}, also fields of the dataset builder): stale_after drops a unit with a
    step more than that many policy versions behind the current one when it is offered (an
    off-policy bound; filters.max_staleness instead excludes stale steps from admission)."
    README: "Dropped units are not served to that consumer (unless the current policy version
    moves back, below) and are counted by reason: each
    manifest has dropped (filtered, stale, capacity) for its pull, and GET
    /api/v1/consumers/{name} gives the totals per dataset (units and steps dropped by reason,
    leases by status, delivered units, and pending_units: what the dataset admits now that
    this consumer has not had, in pending_unit, groups or steps)." """
    # given groups produced by policy versions 1, 2 and 3, with 3 current
    dataset_create(name="all", spec={"serving": {"stale_after": 1}})
    for v in (1, 2, 3):
        policy_version_set(version=v)
        ready_group(f"v{v}", version=v)
    ready_group("unversioned")  # no policy version: stale under the rule
    # when the trainer pulls everything
    body = pull(trainer, batch_size=10).json()
    # then it gets the groups at most one version behind, and the rest are counted as stale
    assert groups_of(body) == ["v2", "v3"]
    assert body["manifest"]["dropped"] == {"filtered": 0, "stale": 2, "capacity": 0}
    entry = status(trainer)
    assert entry["dropped"] == {"filtered": 0, "stale": 2, "capacity": 0}
    assert entry["dropped_steps"]["stale"] == 8  # two groups of 2 rollouts x 2 steps
    assert entry["leases"] == {"leased": 1, "acked": 0, "released": 0, "expired": 0}
    assert entry["delivered_units"] == 2 and entry["pending_units"] == 0
    ready_group("later", version=3)
    assert status(trainer)["pending_units"] == 1
    # and a dropped unit is never offered to that consumer again, even once acked
    trainer.post(f"/api/v1/leases/{body['lease_id']}/ack")
    assert groups_of(pull(trainer).json()) == ["later"]
    assert pull(trainer).json()["lease_id"] is None
    # while another consumer is judged afresh: with version 4 current, v2 is stale too
    policy_version_set(version=4)
    assert groups_of(pull(trainer, consumer="c2", batch_size=10).json()) == ["v3", "later"]
    assert status(trainer, "c2")["dropped"]["stale"] == 3


def test_without_a_current_policy_version_nothing_is_stale(trainer):
    dataset_create(name="all", spec={"serving": {"stale_after": 0}})
    ready_group("g1", version=None)
    assert groups_of(pull(trainer).json()) == ["g1"]


def test_capacity_keeps_the_newest_units_and_drops_the_older_ones(trainer):
    """README: "capacity keeps at most that many ready units waiting for each consumer and
    drops the oldest beyond it (a bounded buffer: a slow trainer stays on recent data)." """
    # given five ready groups waiting for a consumer whose dataset holds at most two
    dataset_create(name="all", spec={"serving": {"capacity": 2}})
    for g in range(5):
        ready_group(f"g{g}")
    # when it pulls one unit
    body = pull(trainer, batch_size=1).json()
    # then the three oldest were dropped, and the oldest kept one is served first
    assert groups_of(body) == ["g3"]
    assert body["manifest"]["dropped"] == {"filtered": 0, "stale": 0, "capacity": 3}
    dropped = Skip.objects.filter(reason=Skip.Reason.CAPACITY).values_list("key", flat=True)
    from pool.models import PromptGroup

    assert set(PromptGroup.objects.filter(id__in=dropped).values_list("uid", flat=True)) == {"g0", "g1", "g2"}
    # and units that become ready later push the oldest waiting ones out
    for g in range(5, 8):
        ready_group(f"g{g}")
    body = pull(trainer, batch_size=10).json()
    assert groups_of(body) == ["g6", "g7"]
    assert status(trainer)["dropped"] == {"filtered": 0, "stale": 0, "capacity": 5}


def test_capacity_spares_units_already_leased(trainer):
    dataset_create(name="all", spec={"serving": {"capacity": 1}})
    ready_group("g0")
    first = pull(trainer).json()
    ready_group("g1")
    ready_group("g2")
    # g0 is leased (not waiting): only g1 is over capacity
    assert groups_of(pull(trainer).json()) == ["g2"]
    assert status(trainer)["dropped"]["capacity"] == 1
    assert trainer.post(f"/api/v1/leases/{first['lease_id']}/ack").status_code == 200


def test_serving_rules_apply_to_step_units(trainer):
    dataset_create(name="all", spec={"grouping": {"keep_groups_whole": False}, "serving": {"stale_after": 0}})
    policy_version_set(version=1)
    ready_group("old", version=1)
    policy_version_set(version=2)
    fresh = ready_group("new", version=2)
    body = pull(trainer, unit="steps", batch_size=100).json()
    assert sorted(body["manifest"]["step_uids"]) == sorted(fresh)
    assert body["manifest"]["dropped"]["stale"] == 4
    assert status(trainer)["dropped_steps"]["stale"] == 4


@pytest.mark.parametrize("unit", ["groups", "steps"])
def test_stale_mode_serve_serves_stale_units_with_their_versions_behind(trainer, unit):
    """README: "Staleness that weighs instead of starving ("serving": {"stale_after": 2,
    "stale_mode": "serve"}, also a field of the dataset builder): stale_mode is drop by default
    (above); with serve a stale unit is never dropped but served with its steps'
    versions_behind, so slow, hard rollouts still reach the trainer, which weighs them (for
    example by importance weights)."
    README: "Every delivered step carries versions_behind, the current policy version minus
    the step's at pull time (null for a step without a version), and each manifest counts the
    steps served that stale_after calls stale (stale_steps; 0 under drop)." """
    # given groups of policy versions 1 and 3 (and one without a version), 3 current, and a
    # dataset that serves stale units rather than dropping them
    grouping = {"keep_groups_whole": unit == "groups"}
    dataset_create(
        name="all", spec={"grouping": grouping, "serving": {"stale_after": 1, "stale_mode": "serve"}}
    )
    policy_version_set(version=1)
    old = ready_group("v1", version=1)
    policy_version_set(version=3)
    fresh = ready_group("v3", version=3)
    unversioned = ready_group("none")
    # when the trainer pulls everything
    body = pull(trainer, unit=unit, batch_size=100).json()
    # then every unit is served, none dropped, each step with its versions behind
    behind = {s["uid"]: s["versions_behind"] for s in body["batch"]["steps"]}
    assert behind == {**dict.fromkeys(old, 2), **dict.fromkeys(fresh, 0), **dict.fromkeys(unversioned, None)}
    assert all(s["staleness"] == s["versions_behind"] for s in body["batch"]["steps"])
    m = body["manifest"]
    assert m["dropped"] == {"filtered": 0, "stale": 0, "capacity": 0}
    # and the manifest counts the stale steps served: v1's and the unversioned group's
    assert m["stale_steps"] == len(old) + len(unversioned) == 8
    assert status(trainer)["dropped"]["stale"] == 0


def test_stale_mode_drop_is_the_default_and_still_drops(trainer):
    dataset_create(name="all", spec={"serving": {"stale_after": 1, "stale_mode": "drop"}})
    dataset_create(name="default", spec={"serving": {"stale_after": 1}})
    policy_version_set(version=1)
    ready_group("v1", version=1)
    policy_version_set(version=3)
    fresh = ready_group("v3", version=3)
    for dataset in ("all", "default"):
        body = pull(trainer, consumer=f"c-{dataset}", dataset=dataset, batch_size=100).json()
        assert sorted(s["uid"] for s in body["batch"]["steps"]) == sorted(fresh)
        assert [s["versions_behind"] for s in body["batch"]["steps"]] == [0] * len(fresh)
        assert body["manifest"]["dropped"]["stale"] == 1 and body["manifest"]["stale_steps"] == 0


def test_capacity_on_step_units(trainer):
    dataset_create(name="all", spec={"grouping": {"keep_groups_whole": False}, "serving": {"capacity": 3}})
    ready_group("g0")
    ready_group("g1")
    newest = list(Step.objects.order_by("-id").values_list("uid", flat=True)[:3])
    body = pull(trainer, unit="steps", batch_size=100).json()
    assert sorted(body["manifest"]["step_uids"]) == sorted(newest)
    assert body["manifest"]["dropped"]["capacity"] == 5


def test_filtered_units_are_counted_too(trainer):
    from curation.services.labels import steps_label

    dataset_create(name="all")
    ready_group("g0")
    ready_group("g1")
    steps_label(
        step_ids=list(Step.objects.filter(trajectory__group__uid="g0").values_list("id", flat=True)),
        label="rejected",
        actor="op",
    )
    assert groups_of(pull(trainer).json()) == ["g1"]
    assert status(trainer)["dropped"] == {"filtered": 1, "stale": 0, "capacity": 0}


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"capacity": 0}, "serving.capacity"),
        ({"stale_after": -1}, "serving.stale_after"),
        ({"stale_after": "old"}, "serving.stale_after"),
        ({"keep": 3}, "serving.keep"),
        ({"stale_after": 1, "stale_mode": "weigh"}, "serving.stale_mode"),
    ],
)
def test_bad_serving_rules_are_400s_naming_the_field(curator, serving, field):
    resp = curator.post("/api/v1/datasets", {"name": "d", "serving": serving}, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == field


def test_a_consumer_that_never_pulled_is_a_404(trainer):
    resp = trainer.get("/api/v1/consumers/nobody")
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "name"


def set_current(client, version: int, *, force: bool = False) -> None:
    resp = client.post("/api/v1/policy-versions", {"version": version, "force": force}, format="json")
    assert resp.status_code == 200, resp.content


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"serving": {"stale_after": 1}}, "stale"),  # dropped when offered
        ({"filters": {"max_staleness": 1}}, "filtered"),  # not admitted
    ],
)
def test_a_drop_for_staleness_is_undone_when_the_version_moves_back(trainer, curator, spec, reason):
    """README: "Drops for staleness are undone when the version moves back: a drop that
    depends on the current policy version (stale; filtered under filters.max_staleness)
    records that version: if the current version later moves back
    below it, the unit is looked at again and served if it passes now. GET
    /api/v1/consumers/{name} counts the stale drops by that version (stale_drops: held,
    deliverable_again, served_since)." """
    # given three ready groups of policy version 5, current
    dataset_create(name="all", spec=spec)
    set_current(curator, 5)
    for g in range(3):
        ready_group(f"g{g}", version=5)
    # when the current version jumps far ahead (an admin's forced change) and the trainer pulls
    set_current(curator, 2**63 - 1, force=True)
    body = pull(trainer, batch_size=10).json()
    # then nothing is served: every group is dropped
    assert body["lease_id"] is None
    entry = status(trainer)
    assert entry["dropped"][reason] == 3 and entry["pending_units"] == 0
    if reason == "stale":
        assert entry["stale_drops"] == [
            {
                "dataset_version": 1,
                "current_policy_version": 2**63 - 1,
                "units": 3,
                "steps": 12,
                "held": 3,
                "deliverable_again": 0,
                "served_since": 0,
            }
        ]
    # when the version is set back (forced) and the trainer pulls again
    set_current(curator, 5, force=True)
    entry = status(trainer)
    if reason == "stale":
        [drop] = entry["stale_drops"]
        assert (drop["units"], drop["held"], drop["deliverable_again"], drop["served_since"]) == (3, 0, 3, 0)
    assert entry["pending_units"] == 3
    again = pull(trainer, batch_size=10).json()
    # then the dropped groups are served after all, and the status says so
    assert groups_of(again) == ["g0", "g1", "g2"]
    entry = status(trainer)
    assert entry["delivered_units"] == 3 and entry["pending_units"] == 0
    if reason == "stale":
        assert [
            (d["units"], d["held"], d["deliverable_again"], d["served_since"]) for d in entry["stale_drops"]
        ] == [(3, 0, 0, 3)]
    assert pull(trainer).json()["lease_id"] is None  # each once


def test_a_unit_still_stale_after_the_move_back_is_dropped_again_under_that_version(trainer, curator):
    dataset_create(name="all", spec={"serving": {"stale_after": 1}})
    set_current(curator, 1)
    ready_group("old", version=1)
    set_current(curator, 5)
    ready_group("new", version=5)
    set_current(curator, 9)
    assert pull(trainer, batch_size=10).json()["lease_id"] is None  # both stale at 9
    set_current(curator, 5, force=True)
    # "new" is fresh again at 5; "old" is still stale and dropped again, now under 5
    assert groups_of(pull(trainer, batch_size=10).json()) == ["new"]
    drops = {
        (d["current_policy_version"], d["held"], d["served_since"]) for d in status(trainer)["stale_drops"]
    }
    assert drops == {(5, 1, 0), (9, 0, 1)}
    assert set(Skip.objects.values_list("policy_version", flat=True)) == {5, 9}
    assert pull(trainer).json()["lease_id"] is None


def test_stale_drops_hold_while_the_version_moves_forward(trainer, curator):
    dataset_create(name="all", spec={"serving": {"stale_after": 0}})
    set_current(curator, 1)
    ready_group("g", version=1)
    set_current(curator, 2)
    assert pull(trainer).json()["lease_id"] is None
    set_current(curator, 3)
    assert pull(trainer).json()["lease_id"] is None
    assert Skip.objects.get().policy_version == 2  # dropped once, under 2; never re-read


def test_the_builder_sets_stale_mode():
    from curation.models import Dataset
    from tests.curation.test_pages import BUILDER, signed_in

    client = signed_in("operator")
    page = client.get("/curation/")
    assert b'data-spec="serving.stale_mode"' in page.content
    resp = client.post("/curation/", {**BUILDER, "name": "weigh", "stale_after": "2", "stale_mode": "serve"})
    assert resp.status_code == 302, resp.content
    serving = Dataset.objects.get(name="weigh").current.spec["serving"]
    assert (serving["stale_after"], serving["stale_mode"]) == (2, "serve")
    # and the rules in words say so
    from curation.specs import serving_summary, spec_parse

    lines = serving_summary(spec_parse({"serving": serving}).serving)
    assert (
        "Fresh: units more than 2 policy versions behind are served, marked with their versions behind"
        in lines
    )


def test_pending_units_count_what_the_consumers_dataset_admits_in_its_unit(trainer):
    # given five ready groups, and a dataset admitting three of them (the train channel's)
    for i in range(5):
        ready_group(f"g{i}", version=None)
    Trajectory.objects.filter(group__uid__in=["g3", "g4"]).update(channel="val")
    dataset_create(name="all", spec={"filters": {"channel": "train"}})
    # when the trainer pulls one group
    body = pull(trainer, batch_size=1).json()
    # then its status counts the admitted groups it has not had, not every ready group of the pool
    entry = status(trainer)
    assert (entry["pending_unit"], entry["delivered_units"], entry["pending_units"]) == ("groups", 1, 2)
    trainer.post(f"/api/v1/leases/{body['lease_id']}/ack")
    assert status(trainer)["pending_units"] == 2
