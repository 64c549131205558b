"""Serving order and reuse per dataset (curation/specs.py Serving ``order``, ``priority``,
``reuse``; curation/services/consume.py): the units a consumer pulls come in the dataset's
order, a reuse budget serves a unit up to max_uses times with its use index, and leases,
acks, nacks, expiry and byte-exact replay keep working under every order.

The pool of every row: four ready groups of two one-step rollouts, ready in this order,
with these reward spreads (population std) and policy versions:

    g0: rewards 0, 0    std 0     version 3
    g1: rewards 0, 1    std 0.5   version 1
    g2: rewards 0, 2    std 1     version 2
    g3: rewards 0, 0.5  std 0.25  version 3

docs/trainers.md, Serving order and reuse: A dataset's serving rules also say in which order its
units are served and how often one consumer may receive each. order is oldest_ready (the
default: oldest-ready first, as above), newest_ready, or priority with a named score in
priority: reward_std serves the groups whose rewards spread the most first, staleness the least
stale first (the highest policy version), ties by age. reuse: {"max_uses": K, "decay": d} lets
one consumer receive a unit up to K times, one use at a time, fewer uses first, its priority
falling by d with each use; each delivery is recorded with its use index, and the manifest then
lists use_indexes beside step_uids. A nack or an expired lease gives its use back, so the same
use is offered again; an ack spends it. With K = 1 (the default) every unit is served exactly
once per consumer, as above, and the manifest is unchanged. Replay stays byte-exact under every
order. Scores are kept by an effect of the groups becoming ready (curation.GroupScore, indexed),
so a priority pull reads an index."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import orjson
import pytest
from django.db import connection, connections
from django.utils import timezone

from curation.models import Delivery, GroupScore, Lease
from curation.services.consume import PullIn, consumer_pull, lease_ack, lease_nack, leases_expire
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Scope, Step
from pool.services.groups import group_upsert
from pool.services.policy import policy_version_set
from tests.conftest import client_for
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

POOL = {"g0": ((0.0, 0.0), 3), "g1": ((0.0, 1.0), 1), "g2": ((0.0, 2.0), 2), "g3": ((0.0, 0.5), 3)}


def scored_group(uid: str, rewards: tuple[float, ...], version: int) -> None:
    """A ready group: one one-step rollout per reward, every step at ``version``."""
    group_upsert(uid=uid, expected_rollouts=len(rewards))
    steps_ingest(
        steps=[
            step_in(
                f"{uid}-r{r}",
                0,
                prompt=[1, 2, r],
                response=[3, r],
                group=uid,
                reward=reward,
                is_last=True,
                policy_version=version,
            )
            for r, reward in enumerate(rewards)
        ]
    )


def the_pool() -> None:
    for v in (1, 2, 3):
        policy_version_set(version=v)
    for uid, (rewards, version) in POOL.items():
        scored_group(uid, rewards, version)


@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


def pull(client, unit: str = "groups", **body):
    resp = client.post("/api/v1/consumers/c1/pull", {"dataset": "d", "unit": unit, **body}, format="json")
    assert resp.status_code == 200, resp.content
    return resp


def delivered(body) -> list[tuple[str, int]]:
    """(group uid, use index) per step of a pulled batch (use 0 where the manifest has no
    use indexes: a dataset without reuse)."""
    m = body["manifest"]
    uses = m.get("use_indexes", [0] * len(m["step_uids"]))
    group_of = {s["uid"]: s["prompt_group_uid"] for s in body["batch"]["steps"]}
    return [(group_of[uid], use) for uid, use in zip(m["step_uids"], uses, strict=True)]


def units(seq: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Consecutive duplicates collapsed: one entry per group unit."""
    out: list[tuple[str, int]] = []
    for item in seq:
        if not out or out[-1] != item:
            out.append(item)
    return out


def _u(groups: str, use: int = 0) -> list[tuple[str, int]]:
    return [(f"g{g}", use) for g in groups]


# (serving rules, unit, expected deliveries in order: (group, use index) per unit (groups)
# or per step (steps), pulling one unit at a time and acking each)
ROWS = [
    pytest.param({}, "groups", _u("0123"), id="default-oldest"),
    pytest.param({"order": "oldest_ready"}, "groups", _u("0123"), id="oldest"),
    pytest.param({"order": "newest_ready"}, "groups", _u("3210"), id="newest"),
    pytest.param({"order": "priority", "priority": "reward_std"}, "groups", _u("2130"), id="spread"),
    # ties by age: g0 and g3 are both at version 3, g0 ready first
    pytest.param({"order": "priority", "priority": "staleness"}, "groups", _u("0321"), id="staleness"),
    pytest.param({"reuse": {"max_uses": 1, "decay": 0.5}}, "groups", _u("0123"), id="oldest-K1"),
    # oldest and newest with reuse: fewer uses first
    pytest.param({"reuse": {"max_uses": 2}}, "groups", _u("0123") + _u("0123", 1), id="oldest-K2"),
    pytest.param(
        {"order": "newest_ready", "reuse": {"max_uses": 3}},
        "groups",
        _u("3210") + _u("3210", 1) + _u("3210", 2),
        id="newest-K3",
    ),
    # effective priority = std - 0.6 x uses: g2 1.0, g1 0.5, g2 0.4, g3 0.25, g0 0,
    # g1 -0.1, g3 -0.35, g0 -0.6
    pytest.param(
        {"order": "priority", "priority": "reward_std", "reuse": {"max_uses": 2, "decay": 0.6}},
        "groups",
        [("g2", 0), ("g1", 0), ("g2", 1), ("g3", 0), ("g0", 0), ("g1", 1), ("g3", 1), ("g0", 1)],
        id="spread-K2",
    ),
    # version - 1.5 x uses: g0 3, g3 3, g2 2, g0 1.5, g3 1.5, g1 1, g2 0.5, g1 -0.5
    pytest.param(
        {"order": "priority", "priority": "staleness", "reuse": {"max_uses": 2, "decay": 1.5}},
        "groups",
        [("g0", 0), ("g3", 0), ("g2", 0), ("g0", 1), ("g3", 1), ("g1", 0), ("g2", 1), ("g1", 1)],
        id="staleness-K2",
    ),
    # step units: a step's spread is its group's; ties by age (step id)
    pytest.param({"order": "priority", "priority": "reward_std"}, "steps", _u("22113300"), id="steps-spread"),
    pytest.param({"order": "newest_ready"}, "steps", _u("33221100"), id="steps-newest"),
    pytest.param(
        {"order": "priority", "priority": "staleness", "reuse": {"max_uses": 2, "decay": 10}},
        "steps",
        _u("00332211") + _u("00332211", 1),
        id="steps-staleness-K2",
    ),
]


@pytest.mark.parametrize(("serving", "unit", "expected"), ROWS)
def test_units_come_in_the_serving_order_with_their_use_index(trainer, serving, unit, expected):
    # given the pool and a dataset with these serving rules
    the_pool()
    grouping = {"keep_groups_whole": unit == "groups"}
    dataset_create(name="d", spec={"grouping": grouping, "serving": serving})
    # when the first unit is nacked, the next lease of it expires, then everything is pulled
    # one unit at a time and acked
    first = pull(trainer, unit, batch_size=1)
    head = delivered(first.json())
    assert trainer.post(f"/api/v1/leases/{first.json()['lease_id']}/nack").json()["status"] == "released"
    again = pull(trainer, unit, batch_size=1, lease_seconds=5)
    leases_expire(now=timezone.now() + timedelta(seconds=6))
    seq: list[tuple[str, int]] = []
    replays: list[tuple[str, bytes]] = [(first.json()["lease_id"], first.content)]
    while True:
        resp = pull(trainer, unit, batch_size=1)
        body = resp.json()
        if body["lease_id"] is None:
            break
        seq += delivered(body)
        replays.append((body["lease_id"], resp.content))
        assert trainer.post(f"/api/v1/leases/{body['lease_id']}/ack").json()["status"] == "acked"
    # then a nacked and an expired unit come back with the same use index, first in line
    as_units = units if unit == "groups" else list
    assert as_units(head) == as_units(delivered(again.json())) == as_units(seq)[:1] == expected[:1]
    # and the whole sequence is the serving order, each use once, nothing more
    assert as_units(seq) == expected
    # and each lease's batch replays byte for byte
    for lease_id, content in replays:
        replay = trainer.get(f"/api/v1/leases/{lease_id}/batch")
        assert replay.status_code == 200 and replay.content == content
    # and the Delivery rows are the acked uses: one per unit and use index
    kind = Delivery.Kind.GROUP if unit == "groups" else Delivery.Kind.STEP
    rows = Delivery.objects.filter(kind=kind).values_list("key", "use_index")
    max_uses = (serving.get("reuse") or {}).get("max_uses", 1)
    n_units = 4 if unit == "groups" else 8
    assert len(rows) == len(set(rows)) == n_units * max_uses
    assert Counter(use for _key, use in rows) == {u: n_units for u in range(max_uses)}


# (serving rules, the first three groups pulled of 12, where g<i> has spread i / 2 and
# version 12 - i)
DEEP = [
    pytest.param({"order": "newest_ready"}, ["h11", "h10", "h9"], id="newest"),
    pytest.param({"order": "priority", "priority": "reward_std"}, ["h11", "h10", "h9"], id="spread"),
    pytest.param({"order": "priority", "priority": "staleness"}, ["h0", "h1", "h2"], id="staleness"),
    pytest.param(
        {"order": "priority", "priority": "reward_std", "reuse": {"max_uses": 2, "decay": 100}},
        ["h11", "h10", "h9"],
        id="spread-K2",
    ),
]


@pytest.mark.parametrize(("serving", "expected"), DEEP)
def test_the_order_holds_beyond_the_candidates_a_pull_reads(trainer, serving, expected):
    # given more ready groups than a one-group pull reads as candidates, the best last
    for v in range(1, 13):
        policy_version_set(version=v)
    for i in range(12):
        scored_group(f"h{i}", (0.0, float(i)), 12 - i)
    dataset_create(name="d", spec={"serving": serving})
    # when three groups are pulled one at a time
    got = []
    for _ in range(3):
        body = pull(trainer, batch_size=1).json()
        got += [g for g, _use in units(delivered(body))]
        trainer.post(f"/api/v1/leases/{body['lease_id']}/ack")
    # then they are the best three by the order, read by the database's ordering
    assert got == expected


# (serving rules, units in order: the pool's groups and "lone", a trajectory without a group
# at version 2, completed after them)
LONE = [
    pytest.param({}, ["g0", "g1", "g2", "g3", "lone"], id="oldest"),
    pytest.param({"order": "newest_ready"}, ["lone", "g3", "g2", "g1", "g0"], id="newest"),
    # a lone trajectory has no spread: 0, like g0, which is older
    pytest.param(
        {"order": "priority", "priority": "reward_std"}, ["g2", "g1", "g3", "g0", "lone"], id="spread"
    ),
    pytest.param(
        {"order": "priority", "priority": "staleness"}, ["g0", "g3", "g2", "lone", "g1"], id="staleness"
    ),
    pytest.param(
        {"order": "priority", "priority": "staleness", "reuse": {"max_uses": 2, "decay": 5}},
        ["g0", "g3", "g2", "lone", "g1"] * 2,
        id="staleness-K2",
    ),
]


@pytest.mark.parametrize(("serving", "expected"), LONE)
def test_trajectories_without_a_group_take_their_place_in_the_order(trainer, serving, expected):
    # given the pool and then a completed trajectory without a group, at version 2
    the_pool()
    steps_ingest(
        steps=[step_in("lone", 0, prompt=[7], response=[8], reward=1.0, is_last=True, policy_version=2)]
    )
    dataset_create(name="d", spec={"serving": serving})
    # when everything is pulled one unit at a time
    got = []
    while (body := pull(trainer, batch_size=1).json())["lease_id"] is not None:
        got += [s["prompt_group_uid"] or s["trajectory_uid"] for s in body["batch"]["steps"][:1]]
        trainer.post(f"/api/v1/leases/{body['lease_id']}/ack")
    # then the lone trajectory comes where its age, spread or version puts it
    assert got == expected


def test_without_reuse_the_manifest_is_as_before_and_with_it_names_use_indexes(trainer):
    # given two datasets over the pool: one with K = 1, one with K = 2
    the_pool()
    dataset_create(name="d", spec={"serving": {"reuse": {"max_uses": 1}}})
    dataset_create(name="e", spec={"serving": {"reuse": {"max_uses": 2}}})
    # when each is pulled
    one = pull(trainer, batch_size=2).json()["manifest"]
    resp = trainer.post("/api/v1/consumers/c1/pull", {"dataset": "e", "batch_size": 2}, format="json")
    two = resp.json()["manifest"]
    # then K = 1 serves today's manifest (no use indexes), K = 2 adds one per step uid
    assert "use_indexes" not in one
    assert set(two) - set(one) == {"use_indexes"}
    assert two["use_indexes"] == [0] * len(two["step_uids"]) == [0, 0, 0, 0]


def test_claw_client_batches_expose_the_use_index_per_step(trainer):
    from claw_client import Batch

    # given a dataset serving each group twice, its first use acked
    the_pool()
    dataset_create(name="d", spec={"serving": {"reuse": {"max_uses": 2}}})
    first = pull(trainer, batch_size=4)
    trainer.post(f"/api/v1/leases/{first.json()['lease_id']}/ack")
    # when the second use is pulled and read by claw_client
    second = Batch(pull(trainer, batch_size=1).content)
    # then each step uid has its use index, as the manifest says
    assert second.use_indexes == {"g0-r0:0": 1, "g0-r1:0": 1}
    assert set(Batch(first.content).use_indexes.values()) == {0}
    assert Batch(b'{"lease_id": null, "manifest": null, "batch": null}').use_indexes == {}


def test_the_consumer_status_counts_units_and_their_uses(trainer):
    # given a dataset serving each group twice, every group taken twice and acked
    the_pool()
    dataset_create(name="d", spec={"serving": {"reuse": {"max_uses": 2}}})
    for _ in range(2):
        lease = pull(trainer, batch_size=10).json()["lease_id"]
        trainer.post(f"/api/v1/leases/{lease}/ack")
    # when its status is read
    [entry] = trainer.get("/api/v1/consumers/c1").json()["datasets"]
    # then it has 4 units delivered, in 8 deliveries, none never delivered
    assert (entry["delivered_units"], entry["deliveries"], entry["pending_units"]) == (4, 8, 0)
    assert entry["leases"]["acked"] == 2


def test_a_unit_in_an_open_lease_is_not_offered_to_its_consumer_again(trainer):
    # given a dataset that serves each group twice
    the_pool()
    dataset_create(name="d", spec={"serving": {"reuse": {"max_uses": 2}}})
    # when the consumer takes every group without acking
    held = pull(trainer, batch_size=10).json()
    # then a second pull finds nothing: one use at a time
    assert units(delivered(held)) == _u("0123")
    assert pull(trainer, batch_size=10).json()["lease_id"] is None
    # and after the ack, every group once more, with use index 1
    trainer.post(f"/api/v1/leases/{held['lease_id']}/ack")
    assert units(delivered(pull(trainer, batch_size=10).json())) == _u("0123", 1)


def test_group_scores_follow_the_groups_rewards():
    # given the pool (each group scored by the effect of GroupsReady)
    the_pool()
    got = {
        s.group.uid: (s.reward_std, s.policy_version, s.ready_at)
        for s in GroupScore.objects.select_related("group")
    }
    ready = dict(PromptGroup.objects.values_list("uid", "ready_at"))
    # then each has its spread, its stalest version, and its ready time
    assert {k: (std, v) for k, (std, v, _at) in got.items()} == {
        "g0": (0.0, 3),
        "g1": (0.5, 1),
        "g2": (1.0, 2),
        "g3": (0.25, 3),
    }
    assert all(abs((at - ready[k]).total_seconds()) < 1 for k, (_s, _v, at) in got.items())


@pytest.mark.parametrize(
    ("serving", "field"),
    [
        ({"order": "random"}, "serving.order"),
        ({"order": "priority"}, "serving.priority"),  # which score?
        ({"priority": "reward_std"}, "serving.order"),  # a score, but another order
        ({"order": "priority", "priority": "loss"}, "serving.priority"),
        ({"reuse": {"max_uses": 0}}, "serving.reuse.max_uses"),
        ({"reuse": {"max_uses": 1001}}, "serving.reuse.max_uses"),
        ({"reuse": {"max_uses": "2"}}, "serving.reuse.max_uses"),
        ({"reuse": {"max_uses": 2, "decay": -1}}, "serving.reuse.decay"),
        ({"reuse": {"uses": 2}}, "serving.reuse.uses"),
        ({"reuse": 2}, "serving.reuse"),
    ],
)
def test_bad_order_and_reuse_rules_are_400s_naming_the_field(make_key, serving, field):
    curator = client_for(make_key(Scope.ADMIN, name="curator"))
    resp = curator.post("/api/v1/datasets", {"name": "d", "serving": serving}, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == field


@pytest.mark.django_db(transaction=True)
def test_concurrent_pullers_never_exceed_max_uses_and_lose_nothing():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent pullers need PostgreSQL (SQLite serialises writers)")
    # given 12 ready groups and a dataset serving each twice per consumer, by priority
    for v in (1, 2, 3):
        policy_version_set(version=v)
    for g in range(12):
        scored_group(f"g{g}", (0.0, float(g % 5)), 1 + g % 3)
    dataset_create(
        name="d", spec={"serving": {"order": "priority", "priority": "reward_std", "reuse": {"max_uses": 2}}}
    )
    # when two consumers each pull with four threads, nacking every third batch
    barrier = threading.Barrier(8)
    acked: list[tuple[str, str, int]] = []  # (consumer, group uid, use index)
    errors: list[BaseException] = []

    def puller(consumer: str) -> None:
        try:
            barrier.wait(timeout=60)
            n = 0
            while True:
                lease = consumer_pull(consumer=consumer, pull=PullIn(dataset="d", batch_size=1))
                if lease is None:
                    return
                n += 1
                if n % 3 == 0:
                    lease_nack(lease_id=lease.id)
                    continue
                m = orjson.loads(bytes(lease.body))["manifest"]
                lease_ack(lease_id=lease.id)
                group = m["step_uids"][0].split("-r")[0]
                acked.append((consumer, group, m["use_indexes"][0]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=puller, args=(c,)) for c in ("a", "a", "a", "a", "b", "b", "b", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    # then every consumer acked every group exactly twice, as uses 0 and 1
    assert errors == []
    assert sorted(acked) == sorted((c, f"g{g}", u) for c in "ab" for g in range(12) for u in (0, 1))
    assert Lease.objects.filter(status=Lease.Status.LEASED).count() == 0
    assert Delivery.objects.count() == 2 * 12 * 2


def test_a_version_stored_before_the_order_existed_is_the_same_spec_with_its_defaults():
    # given a dataset version stored before serving.order and reuse existed
    from curation.models import Dataset
    from curation.services.datasets import dataset_update

    ds = dataset_create(name="d", spec={"serving": {"stale_after": 2}})
    old = {**ds.current.spec, "serving": {"stale_after": 2, "capacity": None}}
    ds.current.spec = old
    ds.current.save(update_fields=["spec"])
    # when the same rules are saved again, then with an order
    dataset_update(name="d", spec={"serving": {"stale_after": 2}})
    same = Dataset.objects.get(name="d").current.version
    dataset_update(name="d", spec={"serving": {"stale_after": 2, "order": "newest_ready"}})
    # then the first adds no version, the second does
    assert same == 1
    assert Dataset.objects.get(name="d").current.version == 2


@pytest.mark.parametrize(
    ("serving", "lines"),
    [
        ({}, ["Order: oldest ready first", "Reuse: none (each unit once per consumer)"]),
        (
            {"order": "priority", "priority": "reward_std", "reuse": {"max_uses": 3, "decay": 0.25}},
            [
                "Order: priority: highest within-group reward spread first, ties oldest first",
                "Reuse: up to 3 uses of a unit per consumer, one at a time, priority falls by 0.25 a use",
            ],
        ),
        (
            {"order": "newest_ready", "reuse": {"max_uses": 2}, "stale_after": 1},
            [
                "Order: newest ready first",
                "Reuse: up to 2 uses of a unit per consumer, one at a time, fewer uses first",
                "Fresh: units more than 1 policy versions behind are dropped",
            ],
        ),
    ],
)
def test_the_dataset_and_consumption_pages_show_the_serving_rules(serving, lines):
    from django.utils.html import escape

    from tests.curation.test_pages import signed_in

    # given a dataset with these serving rules
    dataset_create(name="d", spec={"serving": serving})
    client = signed_in("operator")
    # when its page and the consumption page are read
    pages = [client.get("/curation/datasets/d/"), client.get("/consumption/?dataset=d")]
    # then both list the rules, line by line
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        block = html[html.index("serving-rules") :]
        assert [escape(line) in block for line in lines] == [True] * len(lines)


def test_the_builder_saves_and_shows_the_order_and_the_reuse_budget():
    from curation.models import Dataset
    from tests.curation.test_pages import BUILDER, signed_in

    client = signed_in("operator")
    # when the operator saves a dataset served by priority with a reuse budget
    fields = {"order": "priority", "priority": "staleness", "max_uses": "3", "decay": "0.5"}
    resp = client.post("/curation/", {**BUILDER, "name": "replay", **fields})
    assert resp.status_code == 302, resp.content
    # then the version holds them
    serving = Dataset.objects.get(name="replay").current.spec["serving"]
    assert (serving["order"], serving["priority"], serving["reuse"]) == (
        "priority",
        "staleness",
        {"max_uses": 3, "decay": 0.5},
    )
    # and the builder opens with them, so saving it again keeps them (no new version)
    form = client.get("/curation/?dataset=replay").context["form"]
    shown = {k: form.initial[k] for k in fields}
    assert shown == {"order": "priority", "priority": "staleness", "max_uses": 3, "decay": 0.5}
    client.post("/curation/", {**BUILDER, "name": "replay", **{k: str(v) for k, v in shown.items()}})
    assert Dataset.objects.get(name="replay").current.version == 1


def test_the_migration_backfills_the_scores_the_effect_writes():
    import importlib

    from django.apps import apps

    backfill = importlib.import_module("curation.migrations.0007_serving_order").backfill
    # given the pool, scored by the effect, and a group that is not ready (never scored)
    the_pool()
    group_upsert(uid="open", expected_rollouts=3)
    by_effect = sorted(GroupScore.objects.values_list("group_id", "reward_std", "policy_version", "ready_at"))
    # when the scores are gone and the migration's backfill runs
    GroupScore.objects.all().delete()
    backfill(apps, None)
    # then it writes the same rows (ready time: the group's)
    again = sorted(GroupScore.objects.values_list("group_id", "reward_std", "policy_version", "ready_at"))
    ready = dict(PromptGroup.objects.values_list("id", "ready_at"))
    assert [r[:3] for r in again] == [r[:3] for r in by_effect] and len(again) == 4
    assert all(at == ready[g] for g, _s, _v, at in again)


def test_a_groups_stalest_version_is_its_lowest_and_a_step_without_one_is_staler_than_any():
    # given versions 1..3, a group of rollouts at versions 3 and 1, and a group with a
    # rollout at version 2 and one whose step names no version
    for v in (1, 2, 3):
        policy_version_set(version=v)
    group_upsert(uid="mixed", expected_rollouts=2)
    group_upsert(uid="unversioned", expected_rollouts=2)
    rollouts = [  # (trajectory, group, response, reward, policy version)
        ("mixed-r0", "mixed", 3, 1.0, 3),
        ("mixed-r1", "mixed", 4, 0.0, 1),
        ("unv-r0", "unversioned", 3, 1.0, 2),
        ("unv-r1", "unversioned", 4, 1.0, None),
    ]
    steps_ingest(
        steps=[
            step_in(t, 0, prompt=[1, 2], response=[r], group=g, reward=rw, is_last=True, policy_version=v)
            for t, g, r, rw, v in rollouts
        ]
    )
    assert Step.objects.get(uid="unv-r1:0").policy_version_id is None
    # then the scores: the lowest version, and -1 for the group with a step without one
    got = {s.group.uid: (s.reward_std, s.policy_version) for s in GroupScore.objects.select_related("group")}
    assert got == {
        "mixed": (0.5, 1),
        "unversioned": (0.0, -1),
    }
