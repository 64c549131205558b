"""Lineage (curation/services/lineage.py, curation/selectors/lineage.py, curation/lineage_apis.py):
a run's checkpoints take the acks since the previous one, in ack order; a checkpoint can be
walked to its steps and back; two checkpoints differ by their steps; a run replays byte for
byte. Through the real API (DRF's test client) on a real database."""

from __future__ import annotations

import re

import orjson
import pytest

from curation.models import Checkpoint, CheckpointStep, Lease
from curation.services.datasets import dataset_create
from curation.services.lineage import checkpoints_index_pending
from pool.models import Scope, Step
from tests.conftest import client_for
from tests.curation.test_consume import ready_group

pytestmark = pytest.mark.django_db


@pytest.fixture
def trainer(trainer_key):
    return client_for(trainer_key)


def open_run(client, **body):
    resp = client.post(
        "/api/v1/runs",
        {"consumer": "ppo", "dataset": "all", "name": "r", "config": {"lr": 0.1}, **body},
        format="json",
    )
    assert resp.status_code in (200, 201), resp.content
    return resp.json()


def pull(client, n=1):
    resp = client.post("/api/v1/consumers/ppo/pull", {"dataset": "all", "batch_size": n}, format="json")
    assert resp.status_code == 200, resp.content
    return resp


def publish(client, run, version, status=200):
    resp = client.post("/api/v1/policy-versions", {"version": version, "run": run}, format="json")
    assert resp.status_code == status, resp.content
    return resp.json()


def pages(client, url):
    out = []
    while url:
        page = client.get(url)
        assert page.status_code == 200, page.content
        out += page.json()["results"]
        url = page.json()["next"]
    return out


def test_a_checkpoint_takes_the_acks_since_the_previous_one_in_ack_order(trainer):
    # given a dataset of four ready groups and an open run
    dataset_create(name="all")
    groups = [ready_group(f"g{i}") for i in range(4)]
    run = open_run(trainer)
    assert (run["consumer"], run["dataset"], run["config"]) == ("ppo", "all", {"lr": 0.1})
    # when the trainer acks two leases (the second first), nacks one and publishes version 1
    first, second, nacked = pull(trainer), pull(trainer), pull(trainer)
    for resp in (second, first):
        assert trainer.post(f"/api/v1/leases/{resp.json()['lease_id']}/ack").status_code == 200
    assert trainer.post(f"/api/v1/leases/{nacked.json()['lease_id']}/nack").status_code == 200
    answer = publish(trainer, run["uid"], 1)
    # then checkpoint 1 took the two acked leases, and its steps are theirs in ack order
    assert answer["checkpoint"]["leases"] == 2
    expected = second.json()["manifest"]["step_uids"] + first.json()["manifest"]["step_uids"]
    assert [
        s["uid"] for s in pages(trainer, f"/api/v1/runs/{run['uid']}/checkpoints/1/steps?page_size=3")
    ] == expected
    detail = trainer.get(f"/api/v1/runs/{run['uid']}/checkpoints/1").json()
    assert detail["leases"] == [second.json()["lease_id"], first.json()["lease_id"]]
    assert (detail["steps"], detail["distinct_steps"], detail["removed_steps"]) == (8, 8, 0)
    assert detail["trajectories"] == 4
    assert detail["dataset_versions"] == [{"dataset": "all", "version": 1, "steps": 8}]
    # when the nacked group comes back, is acked, and version 2 is published
    again = pull(trainer)
    assert trainer.post(f"/api/v1/leases/{again.json()['lease_id']}/ack").status_code == 200
    assert publish(trainer, run["uid"], 2)["checkpoint"]["leases"] == 1
    # then every acked step is behind exactly one checkpoint, and the walk back finds it
    cps = pages(trainer, f"/api/v1/runs/{run['uid']}/checkpoints")
    assert [(c["version"], c["leases"], c["steps"]) for c in cps] == [(1, 2, 8), (2, 1, 4)]
    served = [u for r in (second, first, again) for u in r.json()["manifest"]["step_uids"]]
    behind = [
        s["uid"] for v in (1, 2) for s in pages(trainer, f"/api/v1/runs/{run['uid']}/checkpoints/{v}/steps")
    ]
    assert sorted(behind) == sorted(served) and len(set(behind)) == len(behind) == 12
    for uid in served:
        back = pages(trainer, f"/api/v1/steps/{uid}/checkpoints")
        assert [(c["run"], c["version"], c["uses"]) for c in back] == [
            (run["uid"], 1 if uid in expected else 2, 1)
        ]
    assert sorted(u for g in groups for u in g if u in served) == sorted(served)


def test_republishing_the_last_checkpoint_takes_nothing_and_a_lower_one_is_refused(trainer):
    dataset_create(name="all")
    ready_group("g0")
    ready_group("g1")
    run = open_run(trainer)
    trainer.post(f"/api/v1/leases/{pull(trainer).json()['lease_id']}/ack")
    assert publish(trainer, run["uid"], 3)["checkpoint"]["leases"] == 1
    trainer.post(f"/api/v1/leases/{pull(trainer).json()['lease_id']}/ack")
    # a retried publication of version 3: the same checkpoint, taking nothing more
    assert publish(trainer, run["uid"], 3)["checkpoint"] == {
        **publish(trainer, run["uid"], 3)["checkpoint"],
        "leases": 1,
    }
    assert Lease.objects.filter(status="acked", checkpoint__isnull=True).count() == 1
    # a version below the run's last checkpoint: 409 naming version, nothing written
    err = trainer.post(
        "/api/v1/policy-versions", {"version": 2, "run": run["uid"], "force": False}, format="json"
    )
    assert err.status_code == 409
    assert Checkpoint.objects.count() == 1


def test_an_unknown_run_is_a_404_naming_run_and_publishes_nothing(trainer, make_key):
    dataset_create(name="all")
    before = trainer.get("/api/v1/policy-versions").json()
    resp = trainer.post("/api/v1/policy-versions", {"version": 1, "run": "nope"}, format="json")
    assert resp.status_code == 404
    assert resp.json()["error"]["param"] == "run"
    assert trainer.get("/api/v1/policy-versions").json() == before
    # another source's trainer cannot publish into this source's run either
    run = open_run(trainer)
    other = client_for(make_key(Scope.CONSUME, Scope.POLICY, name="other-trainer"))
    assert (
        other.post("/api/v1/policy-versions", {"version": 1, "run": run["uid"]}, format="json").status_code
        == 404
    )
    assert other.get(f"/api/v1/runs/{run['uid']}").status_code == 404


def test_opening_a_run_is_idempotent_by_uid_and_checks_its_fields(trainer):
    dataset_create(name="all")
    dataset_create(name="other")
    first = trainer.post("/api/v1/runs", {"uid": "r1", "consumer": "ppo", "dataset": "all"}, format="json")
    again = trainer.post("/api/v1/runs", {"uid": "r1", "consumer": "ppo", "dataset": "all"}, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json() == again.json()
    clash = trainer.post("/api/v1/runs", {"uid": "r1", "consumer": "ppo", "dataset": "other"}, format="json")
    assert (clash.status_code, clash.json()["error"]["param"]) == (409, "uid")
    for body, field in (
        ({"consumer": "ppo"}, "dataset"),
        ({"consumer": "ppo", "dataset": "nope"}, "dataset"),
        ({"consumer": "ppo", "dataset": "all", "config": [1]}, "config"),
        ({"consumer": "ppo", "dataset": "all", "uid": "a/b"}, "uid"),
        ({"consumer": "ppo", "dataset": "all", "colour": 1}, "colour"),
    ):
        resp = trainer.post("/api/v1/runs", body, format="json")
        assert resp.status_code in (400, 404) and resp.json()["error"]["param"] == field, (body, resp.content)


def test_a_replay_is_every_batch_byte_for_byte_and_names_removed_steps(trainer):
    dataset_create(name="all")
    for i in range(3):
        ready_group(f"g{i}")
    run = open_run(trainer)
    bodies = []
    for version in (1, 2):
        for _ in range(2 if version == 1 else 1):
            resp = pull(trainer)
            bodies.append(resp.content)
            trainer.post(f"/api/v1/leases/{resp.json()['lease_id']}/ack")
        publish(trainer, run["uid"], version)
    checkpoints_index_pending()
    # when a step of the first batch is removed from the pool
    gone = orjson.loads(bodies[0])["manifest"]["step_uids"][1]
    Step.objects.filter(uid=gone).delete()
    # then the replay is the batches as served, in order, naming the removed step
    resp = trainer.get(f"/api/v1/runs/{run['uid']}/replay")
    assert resp.status_code == 200
    lines = b"".join(resp.streaming_content).split(b"\n")[:-1]
    head, cp1, b1, b2, cp2, b3 = lines
    assert orjson.loads(head)["checkpoints"] == 2
    assert [b1, b2, b3] == bodies
    assert [x["removed_steps"] for x in orjson.loads(cp1)["leases"]] == [[gone], []]
    assert orjson.loads(cp2)["version"] == 2
    steps = pages(trainer, f"/api/v1/runs/{run['uid']}/checkpoints/1/steps")
    assert [s["uid"] for s in steps if s["removed"]] == [gone]
    assert CheckpointStep.objects.filter(step_uid=gone).count() == 1


def test_two_checkpoints_differ_by_their_steps(trainer):
    dataset_create(name="all", spec={"serving": {"reuse": {"max_uses": 2}}})
    ready_group("g0")
    ready_group("g1")
    run = open_run(trainer)
    a = pull(trainer, 2)
    trainer.post(f"/api/v1/leases/{a.json()['lease_id']}/ack")
    publish(trainer, run["uid"], 1)
    b = pull(trainer, 1)  # the second use of the oldest group
    trainer.post(f"/api/v1/leases/{b.json()['lease_id']}/ack")
    publish(trainer, run["uid"], 2)
    resp = trainer.get(f"/api/v1/runs/{run['uid']}/checkpoints/1/diff?to=2&side=removed&page_size=2")
    body = resp.json()
    assert body["counts"] == {"added": 0, "removed": 4, "common": 4, "from_steps": 8, "to_steps": 4}
    removed = body["results"] + pages(trainer, body["next"]) if body["next"] else body["results"]
    assert sorted(removed) == sorted(
        set(a.json()["manifest"]["step_uids"]) - set(b.json()["manifest"]["step_uids"])
    )


# --- trainers' verdicts ------------------------------------------------------------------------------
def test_verdicts_are_stored_against_the_step_and_its_checkpoint_and_flag_a_drifting_step(
    trainer, reader_key
):
    from curation.selectors.lineage import step_verdicts
    from curation.selectors.specs import dataset_preview
    from curation.specs import spec_parse

    # given a dataset that flags a rollout/training KL above 0.05, and a run's leased group
    dataset_create(name="all", spec={"serving": {"policy_mismatch_kl": 0.05}})
    uids = ready_group("g0")  # two rollouts of two steps; responses of 2 tokens
    run = open_run(trainer)
    lease = pull(trainer).json()["lease_id"]
    # when the trainer posts its verdicts, one step drifting, one with per-token rows
    body = {
        "steps": [
            {
                "uid": uids[0],
                "importance_ratio": 1.5,
                "logprob_kl": 0.2,
                "advantage": 0.7,
                "clipped_fraction": 0.5,
            },
            {
                "uid": uids[1],
                "logprob_kl": 0.01,
                "tokens": {"importance_ratio": [1.0, 0.5], "logprob_kl": [0.0, 0.25]},
            },
        ]
    }
    resp = trainer.post(f"/api/v1/leases/{lease}/verdicts", body, format="json")
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"stored": 2, "flagged": 1, "policy_mismatch_kl": 0.05}
    # then the drifting step is flagged, readable and filterable; the other is not
    reader = client_for(reader_key)
    assert "policy_mismatch" in reader.get(f"/api/v1/steps/{uids[0]}").json()["quality_flags"]
    assert "policy_mismatch" not in reader.get(f"/api/v1/steps/{uids[1]}").json()["quality_flags"]
    spec = {"filters": {"exclude_flags": ["policy_mismatch"]}, "grouping": {"keep_groups_whole": False}}
    kept = dataset_preview(spec_parse(spec))
    assert kept["steps"] == Step.objects.count() - 1
    # and after ack and checkpoint 1, each verdict names its lease and checkpoint, field by field
    trainer.post(f"/api/v1/leases/{lease}/ack")
    publish(trainer, run["uid"], 1)
    ids = dict(Step.objects.filter(uid__in=uids[:2]).values_list("uid", "id"))
    got = step_verdicts(list(ids.values()))
    first, second = got[ids[uids[0]]][0], got[ids[uids[1]]][0]
    assert {
        k: first[k]
        for k in (
            "lease_id",
            "checkpoint",
            "importance_ratio",
            "logprob_kl",
            "advantage",
            "clipped_fraction",
            "tokens",
        )
    } == {
        "lease_id": lease,
        "checkpoint": {"run": run["uid"], "version": 1},
        "importance_ratio": 1.5,
        "logprob_kl": 0.2,
        "advantage": 0.7,
        "clipped_fraction": 0.5,
        "tokens": {},
    }
    assert second["tokens"] == {"importance_ratio": [1.0, 0.5], "logprob_kl": [0.0, 0.25]}
    assert (second["importance_ratio"], second["logprob_kl"]) == (None, 0.01)
    # a repost replaces the verdict; the flag stays
    again = {"steps": [{"uid": uids[0], "logprob_kl": 0.0}]}
    assert trainer.post(f"/api/v1/leases/{lease}/verdicts", again, format="json").json()["flagged"] == 0
    assert step_verdicts([ids[uids[0]]])[ids[uids[0]]][0]["logprob_kl"] == 0.0
    assert Step.objects.get(uid=uids[0]).quality_flags & 256


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"uid": "nope:0"}, "steps[0].uid"),
        ({"uid": "g0-r0:0", "logprob_kl": "high"}, "steps[0].logprob_kl"),
        ({"uid": "g0-r0:0", "tokens": {"logprob_kl": [0.1]}}, "steps[0].tokens.logprob_kl"),
        ({"uid": "g0-r0:0", "tokens": {"entropy": [0.1, 0.2]}}, "steps[0].tokens.entropy"),
        ({"uid": "g0-r0:0", "colour": 1}, "steps[0].colour"),
    ],
)
def test_a_bad_verdict_names_its_field_and_writes_nothing(trainer, item, field):
    from curation.models import StepVerdict

    dataset_create(name="all", spec={"serving": {"policy_mismatch_kl": 0.0}})
    ready_group("g0")
    lease = pull(trainer).json()["lease_id"]
    resp = trainer.post(
        f"/api/v1/leases/{lease}/verdicts",
        {"steps": [{"uid": "g0-r1:0", "logprob_kl": 1.0}, item]},
        format="json",
    )
    assert resp.status_code in (400, 404), resp.content
    assert resp.json()["error"]["param"] == field.replace("steps[0]", "steps[1]")
    assert StepVerdict.objects.count() == 0 and not Step.objects.filter(quality_flags__gte=256).exists()


def test_a_nacked_lease_takes_no_verdict(trainer):
    dataset_create(name="all")
    uids = ready_group("g0")
    lease = pull(trainer).json()["lease_id"]
    trainer.post(f"/api/v1/leases/{lease}/nack")
    resp = trainer.post(f"/api/v1/leases/{lease}/verdicts", {"steps": [{"uid": uids[0]}]}, format="json")
    assert (resp.status_code, resp.json()["error"]["param"]) == (409, "lease")


def test_a_pull_and_an_ack_run_the_same_statements_within_a_run(trainer):
    """Recording lineage stays off the hot path: with a run open on the consumer, a pull and
    its ack run exactly the statements they run without one (a checkpoint takes the acks
    later, in one UPDATE)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    dataset_create(name="all")
    for i in range(4):
        ready_group(f"g{i}")

    def round_trip(consumer: str) -> list[str]:
        with CaptureQueriesContext(connection) as seen:
            resp = trainer.post(f"/api/v1/consumers/{consumer}/pull", {"dataset": "all"}, format="json")
            trainer.post(f"/api/v1/leases/{resp.json()['lease_id']}/ack")
        # the statements' shapes: ids, uuids, times and savepoint names differ between rounds
        return [re.sub(r'"s\d+_x\d+"', "s", q["sql"].split(" WHERE")[0][:60]) for q in seen.captured_queries]

    for consumer in ("plain", "traced"):  # each consumer's first pull creates it
        round_trip(consumer)
    trainer.post("/api/v1/runs", {"consumer": "traced", "dataset": "all"}, format="json")
    without, within = round_trip("plain"), round_trip("traced")
    assert len(without) > 5 and within == without
