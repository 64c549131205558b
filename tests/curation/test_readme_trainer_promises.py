"""What the README promises a trainer, checked through the real API on a real database.

Each test quotes the README sentences it checks (tests/test_readme_trainer_promises_quoted.py
makes sure every such sentence is quoted by some test). Steps are written through the one
write path (``steps_ingest``) or the API; datasets, pulls, rewards, completions, step reads
and snapshots go through the HTTP API (DRF's test client), and every delivered field is
compared with what was written, field by field.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
from datetime import timedelta

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from django.conf import settings as django_settings
from django.core.files.storage import default_storage
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from curation import tasks as curation_tasks
from curation.models import Delivery, Lease, Skip
from curation.selectors.specs import dataset_preview
from curation.services import consume
from curation.services.labels import steps_label
from curation.services.snapshots import snapshot_build
from curation.specs import spec_parse
from pool.ingest.pipeline import steps_ingest
from pool.models import Scope, Source, Step
from pool.services.api_keys import api_key_create
from pool.services.groups import group_upsert
from pool.services.policy import policy_version_set
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.service_events import feedback_create
from tests.conftest import client_for
from tests.curation.test_consume import ready_group
from tests.live import ROOT
from tests.pool.factories import random_ids, step_in

pytestmark = pytest.mark.django_db


# --- personas and helpers -------------------------------------------------------------------------
@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


@pytest.fixture
def admin(make_key):
    return client_for(make_key(Scope.ADMIN, name="curator"))


@pytest.fixture
def agent(make_key):
    return client_for(make_key(Scope.INGEST, name="agent"))


@pytest.fixture
def reader(make_key):
    return client_for(make_key(Scope.READ, name="reader"))


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def dataset(admin, name: str, **spec) -> dict:
    """Create a dataset through POST /api/v1/datasets."""
    resp = admin.post("/api/v1/datasets", {"name": name, **spec}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def pull(trainer, dataset: str, consumer: str, **body):
    resp = trainer.post(
        f"/api/v1/consumers/{consumer}/pull", {"dataset": dataset, "batch_size": 64, **body}, format="json"
    )
    assert resp.status_code == 200, resp.content
    return resp


def batch_of(resp) -> dict:
    """The ``batch`` part of a pull answer, exactly as served (its bytes), parsed."""
    raw = resp.content
    return orjson.loads(raw[raw.index(b'"batch":') + len(b'"batch":') : -1])


def write(
    traj: str, steps: list[tuple[int, float | None]], *, seed: int = 0, end: bool = True, **extra
) -> None:
    """A trajectory of steps given as (branch, own reward or None), each prompt extending the
    previous prompt and response; the last one is_last when ``end``."""
    rng = random.Random(seed)
    ctx = random_ids(rng, 6)
    batch = []
    for i, (branch, reward) in enumerate(steps):
        response = random_ids(rng, 3)
        batch.append(
            step_in(
                traj,
                i,
                prompt=list(ctx),
                response=response,
                branch=branch,
                reward=reward,
                is_last=end and i == len(steps) - 1,
                rollout_logprobs=[-0.5 - k for k in range(len(response))],
                **extra,
            )
        )
        ctx = ctx + response
    # written as the agent's source (the ``agent`` key's): a key acts on its own source's data
    steps_ingest(steps=batch, source_id=Source.objects.get_or_create(name="agent")[0].id)


def snapshot(trainer, dataset: str) -> tuple[dict, list[dict], list[dict]]:
    """POST /api/v1/snapshots, the build task's body run here, then the status and both
    files downloaded through the API: (status, JSONL rows, Parquet rows)."""
    resp = trainer.post("/api/v1/snapshots", {"dataset": dataset}, format="json")
    assert resp.status_code == 202, resp.content
    sid = resp.json()["id"]
    snapshot_build(snapshot_id=sid)
    status = trainer.get(f"/api/v1/snapshots/{sid}").json()
    assert status["status"] == "done", status
    files = {}
    for fmt in ("jsonl", "parquet"):
        got = trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": fmt})
        assert got.status_code == 200
        files[fmt] = b"".join(got.streaming_content)
    jsonl = [orjson.loads(line) for line in files["jsonl"].splitlines()]
    parquet = pq.read_table(io.BytesIO(files["parquet"]))
    return status, jsonl, parquet.to_pylist()


def served(rows: list[dict]) -> list[tuple]:
    return [(r["uid"], r["reward"], r["reward_scope"], r["reward_source"]) for r in rows]


def per_row(batch: dict) -> list[tuple]:
    return list(
        zip(batch["uid"], batch["reward"], batch["reward_scope"], batch["reward_source"], strict=True)
    )


def kinds(rows: list[dict]) -> list[tuple]:
    """(uid, outcome_reward, process_reward) of each row."""
    return [(r["uid"], r["outcome_reward"], r["process_reward"]) for r in rows]


def kinds_per_row(batch: dict) -> list[tuple]:
    return list(zip(batch["uid"], batch["outcome_reward"], batch["process_reward"], strict=True))


# --- pulling --------------------------------------------------------------------------------------
def test_a_trainer_pulls_with_a_consume_key_and_the_dataset_name_alone(trainer, admin, agent, reader):
    """README: "A trainer pulls what a dataset admits, under a lease, without knowing anything
    about the agent runtime (curation/services/consume.py; scope consume):" """
    # given: a dataset and a completed trajectory it admits
    dataset(admin, "all")
    write("t", [(0, None), (0, 1.0)])
    # when: keys without the consume scope pull, then the trainer, naming only the dataset
    for other in (agent, reader):
        resp = other.post("/api/v1/consumers/c/pull", {"dataset": "all"}, format="json")
        assert resp.status_code == 403 and resp.json()["error"]["type"] == "permission_error"
    body = pull(trainer, "all", "c").json()
    # then: only the trainer gets the steps, under a lease that is open until it ends it
    assert [s["uid"] for s in body["batch"]["steps"]] == ["t:0", "t:1"]
    lease = Lease.objects.get(id=body["lease_id"])
    assert lease.status == "leased" and lease.expires_at > timezone.now()
    assert Lease.objects.count() == 1


def test_a_pull_that_loses_a_unit_to_a_concurrent_pull_takes_the_next_candidate(trainer, admin, monkeypatch):
    """README: "Exactly once per consumer: a pull claims each unit (a whole prompt group, a
    trajectory without a group, or a step for unit: steps datasets) by inserting a Delivery
    row unique per consumer, dataset and unit; concurrent pullers (threads or processes,
    tested with 8 on PostgreSQL) never share a unit, and one that loses a unit takes the next
    candidate." (the losing pull, made deterministic: another pull of the same consumer claims
    the unit between this pull's read of its candidates and its claim)"""
    # given: two ready groups, g0 the older
    dataset(admin, "all")
    first, second = ready_group("g0"), ready_group("g1")
    real_insert = consume._insert
    raced: list[list[str]] = []

    def insert(who, ds, lease, units):
        if not raced:  # the other puller wins the race for this pull's first candidate
            raced.append([])
            other = consume.consumer_pull(  # the same consumer: names are per source
                consumer=who.name,
                pull=consume.PullIn(dataset="all", batch_size=1),
                actor=consume.Actor(source_id=who.source_id),
            )
            raced[0] = orjson.loads(bytes(other.body))["manifest"]["step_uids"]
        return real_insert(who, ds, lease, units)

    monkeypatch.setattr(consume, "_insert", insert)
    # when: the consumer pulls one group
    body = pull(trainer, "all", "c", batch_size=1).json()
    # then: the other pull got g0, this one the next candidate, g1; each unit has one Delivery
    assert raced == [first]
    assert body["manifest"]["step_uids"] == second
    assert Delivery.objects.filter(consumer__name="c").count() == 2
    assert pull(trainer, "all", "c").json()["lease_id"] is None


def test_an_expired_lease_ends_at_the_next_pull_of_its_consumer_and_by_the_periodic_task(trainer, admin):
    """README: "A nack, or a lease that expires (checked at every pull of that consumer and by
    the periodic curation.leases_expire), deletes its rows: the units are offered again."
    README: "An expired lease cannot be acked (409)." """
    dataset(admin, "all")
    uids = ready_group("g1")
    past = timezone.now() - timedelta(seconds=1)
    # given: a lease of consumer a past its expiry
    a = pull(trainer, "all", "a").json()["lease_id"]
    Lease.objects.filter(id=a).update(expires_at=past)
    # when: a pulls again, then its units come back, and the expired lease is ended
    again = pull(trainer, "all", "a").json()
    assert again["manifest"]["step_uids"] == uids
    assert Lease.objects.get(id=a).status == "expired"
    assert not Delivery.objects.filter(lease_id=a).exists()
    resp = trainer.post(f"/api/v1/leases/{a}/ack")
    assert resp.status_code == 409 and resp.json()["error"]["param"] == "lease"
    # given: a lease of consumer b past its expiry, which b does not pull again
    b = pull(trainer, "all", "b").json()["lease_id"]
    Lease.objects.filter(id=b).update(expires_at=past)
    # when: the periodic task runs (it is on the beat schedule)
    schedule = {e["task"] for e in django_settings.CELERY_BEAT_SCHEDULE.values()}
    assert "curation.leases_expire" in schedule
    assert curation_tasks.leases_expire.apply().get() == 1
    # then: the lease is expired, its rows are gone, and b is offered the units again
    assert Lease.objects.get(id=b).status == "expired"
    assert not Delivery.objects.filter(lease_id=b).exists()
    assert pull(trainer, "all", "b").json()["manifest"]["step_uids"] == uids


def test_ready_groups_and_lone_trajectories_are_offered_oldest_ready_first(trainer, admin):
    """README: "Oldest-ready first, no head-of-line blocking: candidates are ready groups by
    ready_at (index group_ready) and completed lone trajectories by completion time; a group
    that is not ready is never a candidate." """
    from pool.models import PromptGroup, Trajectory

    dataset(admin, "all")
    # given: groups and lone trajectories becoming ready in turn, and a group never ready
    group_upsert(uid="waiting", expected_rollouts=3)
    write("w-r0", [(0, 1.0)], group="waiting")
    ready_group("g-first")
    write("lone-1", [(0, None), (0, 1.0)], seed=1)
    ready_group("g-second")
    write("lone-2", [(0, 1.0)], seed=2)
    ready_at = dict(PromptGroup.objects.filter(ready_at__isnull=False).values_list("uid", "ready_at"))
    completed = dict(Trajectory.objects.filter(group__isnull=True).values_list("uid", "completed_at"))
    expected = [u for _, u in sorted([(t, u) for u, t in (ready_at | completed).items()])]
    assert expected == ["g-first", "lone-1", "g-second", "lone-2"]
    # when: the trainer pulls one unit at a time
    got = []
    while (body := pull(trainer, "all", "c", batch_size=1).json())["lease_id"]:
        steps = body["batch"]["steps"]
        got.append(steps[0]["prompt_group_uid"] or steps[0]["trajectory_uid"])
    # then: both queues are merged by the time each unit became ready; the waiting group never
    assert got == expected


def test_units_a_version_does_not_admit_are_skipped_once_and_offered_again_under_the_next(trainer, admin):
    """README: "Units a dataset version does not admit when offered are recorded once (Skip,
    reason filtered) and not read again by that consumer under that version." """
    # given: a dataset of rewards >= 0.5, an older ready group it does not admit, a newer one
    # it does
    dataset(admin, "good", filters={"reward_min": 0.5})
    for uid, reward in (("low", 0.0), ("high", 1.0)):
        group_upsert(uid=uid, expected_rollouts=1)
        write(f"{uid}-r0", [(0, reward)], group=uid)
    # when: the consumer pulls twice
    first = pull(trainer, "good", "c").json()
    second = pull(trainer, "good", "c").json()
    # then: the admitted group came, the other was recorded once as filtered, and not again
    assert first["manifest"]["step_uids"] == ["high-r0:0"]
    assert first["manifest"]["dropped"] == {"filtered": 1, "stale": 0, "capacity": 0}
    assert second["lease_id"] is None and second["manifest"] is None
    skips = Skip.objects.filter(consumer__name="c")
    assert list(skips.values_list("dataset_version__version", "reason", "key")) == [
        (1, Skip.Reason.FILTERED, Step.objects.get(uid="low-r0:0").trajectory.group_id)
    ]
    # when: a new version admits every reward, the unit is offered again to that consumer
    resp = admin.patch("/api/v1/datasets/good", {"filters": {}}, format="json")
    assert resp.status_code == 200, resp.content
    third = pull(trainer, "good", "c").json()
    assert third["manifest"]["dataset_version"] == 2
    assert third["manifest"]["step_uids"] == ["low-r0:0"]


# --- what a batch holds ---------------------------------------------------------------------------
@pytest.fixture
def mixed(admin) -> list[str]:
    """A dataset "mixed" (groups of 3 kept whole, a rollout under reward 0.5 masked) and one
    ready group: rollout 0 rewarded 0.0 on its last step only (masked), rollout 1 rewarded on
    every step under policy version 1, rollout 2 rewarded by its trajectory at completion,
    without a policy version and without logprobs; version 3 current. Returns the uids."""
    policy_version_set(version=1)
    group_upsert(uid="g", expected_rollouts=3)
    write("g-r0", [(0, None), (0, 0.0)], group="g", seed=1, policy_version=1)
    write("g-r1", [(0, 0.75), (0, 1.0)], group="g", seed=2, policy_version=1)
    rng = random.Random(3)
    closer, closer_key = api_key_create(name="closer", scopes=["ingest"])
    steps_ingest(
        steps=[
            step_in("g-r2", i, prompt=random_ids(rng, 4 + i), response=random_ids(rng, 2 + i), group="g")
            for i in range(2)
        ],
        source_id=closer.source_id,
    )
    resp = client_for(closer_key).post("/api/v1/trajectories/g-r2/complete", {"reward": 0.5}, format="json")
    assert resp.status_code == 200, resp.content
    policy_version_set(version=3)
    dataset(
        admin,
        "mixed",
        filters={"reward_min": 0.5},
        grouping={"short_groups": "mask", "min_rollouts": 3},
    )
    return ["g-r0:0", "g-r0:1", "g-r1:0", "g-r1:1", "g-r2:0", "g-r2:1"]


def test_the_steps_format_is_each_step_as_a_step_read_returns_it(trainer, reader, mixed):
    """README: "steps gives each step as a step read returns it, with mask, staleness,
    versions_behind and token_versions_behind added." """
    rows = pull(trainer, "mixed", "s").json()["batch"]["steps"]
    assert [r["uid"] for r in rows] == mixed
    added = ("mask", "staleness", "versions_behind", "token_versions_behind")
    for row in rows:
        read = reader.get(f"/api/v1/steps/{row['uid']}").json()
        assert {k: v for k, v in row.items() if k not in added} == read
        assert set(row) == set(read) | set(added)
        # versions_behind is staleness under the per-token field's name; these steps have
        # no token_policy_versions
        assert row["versions_behind"] == row["staleness"] and row["token_versions_behind"] is None
    # mask: the rollout under reward_min is served masked; staleness: current 3 - version 1
    assert [(r["mask"], r["staleness"]) for r in rows] == [(True, 2)] * 2 + [(False, 2)] * 2 + [
        (False, None)
    ] * 2


ROW_LISTS = (
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_index",
    "policy_version",
    "staleness",
    "mask",
    "reward",
    "reward_scope",
    "reward_source",
    "outcome_reward",
    "process_reward",
)


def test_padded_and_tree_carry_per_row_lists_in_row_order(trainer, mixed):
    """README: "Formats (curation/formats.py): every format serves the same steps in the same
    order."
    README: "padded and tree carry per-row lists in row order: uid, trajectory_uid,
    prompt_group_uid, step_index, policy_version, staleness, mask, reward, reward_scope,
    reward_source, outcome_reward, process_reward and has_rollout_logprobs."
    README: "In padded and tree such a step's logprobs are 0.0 and its has_rollout_logprobs
    is false." """
    # given: the same units pulled in the three formats by three consumers
    rows = pull(trainer, "mixed", "s", format="steps").json()["batch"]["steps"]
    padded = pull(trainer, "mixed", "p", format="padded").json()["batch"]
    tree = pull(trainer, "mixed", "t", format="tree").json()["batch"]
    # then: the same steps in the same order, each per-row list the steps' values in order
    assert [r["uid"] for r in rows] == mixed
    for name in ROW_LISTS:
        assert padded[name] == tree[name] == [r[name] for r in rows], name
    has = [r["rollout_logprobs"] is not None for r in rows]
    assert padded["has_rollout_logprobs"] == tree["has_rollout_logprobs"] == has == [True] * 4 + [False] * 2
    # and the rewards are the effective ones, scope and source per row
    assert per_row(padded) == [
        ("g-r0:0", 0.0, "branch", "env"),
        ("g-r0:1", 0.0, "step", "env"),
        ("g-r1:0", 0.75, "step", "env"),
        ("g-r1:1", 1.0, "step", "env"),
        ("g-r2:0", 0.5, "trajectory", "env"),
        ("g-r2:1", 0.5, "trajectory", "env"),
    ]
    # and a step without logprobs has 0.0 for each of its response tokens
    for i in (4, 5):
        n = len(rows[i]["response_ids"])
        assert padded["rollout_logprobs"][i][:n] == [0.0] * n
        lo, hi = tree["response_offsets"][i], tree["response_offsets"][i + 1]
        assert tree["rollout_logprobs"][lo:hi] == [0.0] * n


def test_collate_steps_of_a_pulled_batch_is_the_padded_layout(trainer, mixed):
    """README: "claw_client.collate_steps(batch) makes torch tensors of a steps batch in the
    padded layout (left-padded prompts, right-padded responses, attention mask, positions,
    logprobs) with per-step rewards (0.0 where null, has_reward false); its response_mask is
    the padded format's (a masked step's row is all 0) and step_mask is true for the steps
    trained on." """
    torch = pytest.importorskip("torch")
    from claw_client import collate_steps

    # given: the same units pulled as steps and as padded
    steps = pull(trainer, "mixed", "s", format="steps").json()
    padded = pull(trainer, "mixed", "p", format="padded").json()["batch"]
    # when: the steps batch is collated
    t = collate_steps(steps)
    # then: the padded format's arrays, as tensors
    for name in ("prompts", "responses", "input_ids", "attention_mask", "position_ids"):
        assert t[name].tolist() == [[int(x) for x in row] for row in padded[name]], name
    assert t["rollout_logprobs"].dtype == torch.float32
    assert t["rollout_logprobs"].tolist() == [
        [float(np.float32(x)) for x in row] for row in padded["rollout_logprobs"]
    ]
    # and the response mask is the padded format's (masked steps' rows all 0), step_mask the
    # steps trained on
    assert t["response_mask"].long().tolist() == padded["response_mask"]
    assert t["step_mask"].tolist() == [not m for m in padded["mask"]]
    assert any(padded["mask"]) and not all(padded["mask"])  # the batch has both kinds
    # and one reward per step: the served reward (none is null here: see the null case below)
    assert t["rewards"].tolist() == padded["reward"] and t["has_reward"].all()
    null = collate_steps({"steps": [{**steps["batch"]["steps"][0], "reward": None}]})
    assert null["rewards"].tolist() == [0.0] and null["has_reward"].tolist() == [False]


def test_a_manifest_names_what_the_batch_holds(trainer, admin, mixed):
    """README: "Its manifest names the dataset version, the step uids, the policy versions and
    staleness (for importance-sampling corrections), and the sha256 of the batch bytes."
    README: "Manifests (pulls and snapshots) count the steps per policy version in
    policy_versions (string keys), and the steps without one in
    steps_without_policy_version, never under a "None" key." """
    # given: the dataset's version 2 (admitting the same steps)
    resp = admin.patch(
        "/api/v1/datasets/mixed",
        {"filters": {"reward_min": 0.5, "exclude_tags": ["none-such"]}},
        format="json",
    )
    assert resp.status_code == 200 and resp.json()["version"] == 2
    # when: the trainer pulls
    resp = pull(trainer, "mixed", "c")
    m, batch = resp.json()["manifest"], batch_of(resp)
    # then
    assert m["dataset"] == "mixed" and m["dataset_version"] == 2
    assert m["step_uids"] == [s["uid"] for s in batch["steps"]] == mixed
    assert m["policy_versions"] == {"1": 4} and m["steps_without_policy_version"] == 2
    assert m["current_policy_version"] == 3
    assert m["staleness"] == {"min": 2, "max": 2}
    assert [s["staleness"] for s in batch["steps"]] == [2, 2, 2, 2, None, None]
    raw = resp.content
    assert (
        m["content_hash"] == hashlib.sha256(raw[raw.index(b'"batch":') + len(b'"batch":') : -1]).hexdigest()
    )
    assert (m["units"], m["masked_steps"], m["reward_assignment"]) == (1, 2, "each_step")
    # and a snapshot's manifest counts the same way
    status, _, _ = snapshot(trainer, "mixed")
    sm = status["manifest"]
    assert (sm["dataset_version"], sm["steps"], sm["masked_steps"]) == (2, 6, 2)
    assert sm["policy_versions"] == {"1": 4} and sm["steps_without_policy_version"] == 2
    assert "None" not in sm["policy_versions"] and "None" not in m["policy_versions"]


# --- rewards --------------------------------------------------------------------------------------
def test_every_reader_serves_the_effective_reward(trainer, admin, agent, reader):
    """README: "Every reader serves it: step reads (reward, reward_source, reward_scope,
    reward_status), the three formats and snapshots."
    README: "Beside it every reader serves the two kinds apart: outcome_reward (the branch's
    outcome, null while there is none) and process_reward (the step's own reward when the step
    is not its branch's final one, else null), in step reads, the three formats, snapshots
    (JSONL and Parquet), the verl DataProto (outcome_rewards, process_rewards) and the TRL
    rollouts." (verl: tests/integrations/test_verl_dataproto.py; TRL:
    tests/curation/test_trl_exports.py)
    README: "A step's effective reward is defined once (pool/services/effective_reward.py)
    and stored on the step: its own reward, else its branch's outcome."
    README: "Two kinds of reward are kept apart."
    README: "A branch's outcome is the own final reward of its final step (its step marked
    is_last, else, once the trajectory has ended, its highest step), else its trajectory's
    reward."
    README: "Any other own reward is a process reward of that step alone (a rule that checked
    one tool call): it reaches no other step."
    README: "A branch gets its outcome from a final reward on its final step (POST
    /api/v1/rewards with step_uid; its final step is its step marked is_last, else, once the
    trajectory has ended, its highest step), and its other steps without one are served it."
    README: "A reward on any other step is a process reward of that step alone: it reaches no
    other step." """
    # given: a trajectory of two branches, step 1 rewarded at submission, completed with a
    # trajectory reward, then step 2 rewarded late through the API; and an unrewarded one
    write("t", [(0, None), (0, 0.5), (0, None), (1, None)], end=False)
    write("bare", [(0, None)], seed=1)
    assert agent.post("/api/v1/trajectories/t/complete", {"reward": -1.0}, format="json").status_code == 200
    resp = agent.post("/api/v1/rewards", {"step_uid": "t:2", "reward": 1.0, "source": "model"}, format="json")
    assert resp.status_code == 200 and resp.json()["applied"] == 1
    expected = [
        ("bare:0", None, None, None),
        ("t:0", 1.0, "branch", "model"),  # branch 0's last step with a final own reward: t:2
        ("t:1", 0.5, "step", "env"),
        ("t:2", 1.0, "step", "model"),
        ("t:3", -1.0, "trajectory", "env"),  # branch 1 has no rewarded step
    ]
    # then: step reads, one by one and listed, with reward_status
    one = [reader.get(f"/api/v1/steps/{uid}").json() for uid, *_ in expected]
    assert served(one) == expected
    assert [r["reward_status"] for r in one] == ["pending", "final", "final", "final", "final"]
    listed = reader.get("/api/v1/steps", {"page_size": 10}).json()["results"]
    assert sorted(served(listed)) == expected
    # and the three formats of a dataset of every stored step, and its snapshot
    dataset(admin, "every", filters={"readiness": "any"}, grouping={"keep_groups_whole": False})
    rows = pull(trainer, "every", "s", unit="steps").json()["batch"]["steps"]
    assert sorted(served(rows)) == expected
    for fmt in ("padded", "tree"):
        b = pull(trainer, "every", fmt, unit="steps", format=fmt).json()["batch"]
        assert sorted(per_row(b)) == expected, fmt
    _, jsonl, parquet = snapshot(trainer, "every")
    assert served(jsonl) == served(parquet) and sorted(served(jsonl)) == expected
    # and: every one of them serves the two kinds apart: branch 0's outcome is t:2's own
    # reward (its final step once the trajectory ended), t:1's a process reward; branch 1's
    # outcome the trajectory's
    two_kinds = [
        ("bare:0", None, None),
        ("t:0", 1.0, None),
        ("t:1", 1.0, 0.5),
        ("t:2", 1.0, None),
        ("t:3", -1.0, None),
    ]
    assert kinds(one) == two_kinds and sorted(kinds(listed)) == two_kinds and sorted(kinds(rows)) == two_kinds
    for fmt in ("padded", "tree"):
        b = pull(trainer, "every", f"k{fmt}", unit="steps", format=fmt).json()["batch"]
        assert sorted(kinds_per_row(b)) == two_kinds, fmt
    assert kinds(jsonl) == kinds(parquet) and sorted(kinds(jsonl)) == two_kinds


def pull_all(trainer, name: str, consumer: str, **body) -> list[dict]:
    return pull(trainer, name, consumer, **body).json()["batch"]["steps"]


def test_reward_assignment_each_step_last_step_and_discounted_return(trainer, admin):
    """README: "A dataset chooses how rewards reach the steps of a multi-step trajectory with
    grouping.reward_assignment, applied to its pulls and snapshots."
    README: "With discounted_return (and grouping.gamma in [0, 1], 1 when left out) every step
    carries its return along its branch, G_t = r_t + gamma x G_{t+1}, where r_t is its
    process reward (0 without one) and the branch's final step also adds the outcome;
    reward_scope is return."
    README: "In every assignment outcome_reward and process_reward are served as stored."
    README: "What each assignment serves as reward, by the kind of reward a step has (O the
    branch's outcome, p the step's process reward, T the trajectory's reward, G_t as above):"
    And the README's table, by hand: forked's branch 0 (a process reward 0.3 on step 1, its
    outcome the trajectory's 1.0) and branch 1 (outcome 1.0).
    README: "With each_step (the default) every step carries its effective reward."
    README: "With last_step the last step of each branch carries it, and the other steps
    their own reward if they have one, else 0.0 with reward_scope none and reward_source null
    (as Claw-R1's own pool serves them):"
    And the README's example: three steps, only the last rewarded (1.0, final), are served as
    each_step [1.0, 1.0, 1.0] / ["branch", "branch", "step"] and last_step [0.0, 0.0, 1.0] /
    ["none", "none", "step"]."""
    # given: the README's datasets and example trajectory, and a trajectory of two branches
    # with an own reward inside branch 0, rewarded 1.0 at completion
    created = dataset(admin, "grpo-last", grouping={"reward_assignment": "last_step"})
    assert created["grouping"]["reward_assignment"] == "last_step"
    assert dataset(admin, "grpo-each")["grouping"]["reward_assignment"] == "each_step"
    write("example", [(0, None), (0, None), (0, 1.0)])
    write("forked", [(0, None), (0, 0.3), (0, None), (1, None), (1, None)], end=False, seed=1)
    rewards_apply(rewards=[RewardIn(trajectory_uid="forked", reward=1.0)])
    from pool.services.trajectories import trajectory_complete

    trajectory_complete(uid="forked")
    # (until issue 18, forked:1's process reward 0.3 was taken for branch 0's and served to
    # forked:0 and forked:2, scope branch; branch 0's outcome is the trajectory's 1.0)
    each = [
        ("example:0", 1.0, "branch", "env"),
        ("example:1", 1.0, "branch", "env"),
        ("example:2", 1.0, "step", "env"),
        ("forked:0", 1.0, "trajectory", "env"),
        ("forked:1", 0.3, "step", "env"),
        ("forked:2", 1.0, "trajectory", "env"),
        ("forked:3", 1.0, "trajectory", "env"),
        ("forked:4", 1.0, "trajectory", "env"),
    ]
    last = [
        ("example:0", 0.0, "none", None),
        ("example:1", 0.0, "none", None),
        ("example:2", 1.0, "step", "env"),
        ("forked:0", 0.0, "none", None),
        ("forked:1", 0.3, "step", "env"),  # its own
        ("forked:2", 1.0, "trajectory", "env"),  # the last step of branch 0
        ("forked:3", 0.0, "none", None),
        ("forked:4", 1.0, "trajectory", "env"),  # the last step of branch 1
    ]
    # by hand, gamma 0.5: example: G2 = 1.0, G1 = 0.5, G0 = 0.25; forked branch 0 (steps 0-2):
    # G2 = 1.0 (the outcome), G1 = 0.3 + 0.5, G0 = 0.5 x 0.8; branch 1: G4 = 1.0, G3 = 0.5
    ret = [
        ("example:0", 0.25, "return", "env"),
        ("example:1", 0.5, "return", "env"),
        ("example:2", 1.0, "return", "env"),
        ("forked:0", 0.4, "return", "env"),
        ("forked:1", 0.8, "return", "env"),
        ("forked:2", 1.0, "return", "env"),
        ("forked:3", 0.5, "return", "env"),
        ("forked:4", 1.0, "return", "env"),
    ]
    dataset(admin, "grpo-return", grouping={"reward_assignment": "discounted_return", "gamma": 0.5})
    stored = [
        ("example:0", 1.0, None),
        ("example:1", 1.0, None),
        ("example:2", 1.0, None),
        ("forked:0", 1.0, None),
        ("forked:1", 1.0, 0.3),
        ("forked:2", 1.0, None),
        ("forked:3", 1.0, None),
        ("forked:4", 1.0, None),
    ]
    for name, want in (("grpo-each", each), ("grpo-last", last), ("grpo-return", ret)):
        # when: pulled in every format and snapshotted
        steps = pull(trainer, name, "steps")
        assignment = {"grpo-each": "each_step", "grpo-last": "last_step"}.get(name, "discounted_return")
        assert steps.json()["manifest"]["reward_assignment"] == assignment
        assert served(steps.json()["batch"]["steps"]) == want, name
        assert kinds(steps.json()["batch"]["steps"]) == stored, name
        padded = pull(trainer, name, "padded", format="padded").json()["batch"]
        tree = pull(trainer, name, "tree", format="tree").json()["batch"]
        assert per_row(padded) == per_row(tree) == want, name
        # the padded rewards: the served reward on each step's last response token
        assert [row[-1] for row in padded["token_level_rewards"]] == [w[1] for w in want]
        _, jsonl, parquet = snapshot(trainer, name)
        assert served(jsonl) == served(parquet) == want, name
        assert kinds(jsonl) == kinds(parquet) == kinds_per_row(padded) == kinds_per_row(tree) == stored, name


def test_grouping_gamma_is_refused_out_of_range_or_without_discounted_return(admin):
    """README: "A gamma out of range, or given with another assignment, is refused with a 400
    naming grouping.gamma." """
    for grouping in (
        {"reward_assignment": "discounted_return", "gamma": 1.5},
        {"reward_assignment": "discounted_return", "gamma": -0.1},
        {"reward_assignment": "each_step", "gamma": 0.9},
        {"gamma": 0.9},
    ):
        resp = admin.post("/api/v1/datasets", {"name": "bad", "grouping": grouping}, format="json")
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "grouping.gamma", grouping
    from curation.models import Dataset

    assert not Dataset.objects.filter(name="bad").exists()


def test_reward_filters_read_the_effective_reward_as_stored(trainer, admin):
    """README: "The filters reward_min/reward_max and reward_status read the effective reward
    as stored."
    README: "A provisional own reward is served as the step's reward, but the step is not
    reward-final (reward_status pending) and the reward does not reach its branch."
    README: "A step with a process reward only is reward-final once its branch's outcome
    is." (every order of writes: tests/pool/test_reward_kinds.py)"""
    # given: the README's example trajectory and one whose last step has a provisional reward
    write("example", [(0, None), (0, None), (0, 1.0)])
    write("provisional", [(0, None), (0, None)], seed=1)
    rewards_apply(rewards=[RewardIn(step_uid="provisional:1", reward=0.9, final=False)])
    any_steps = {"readiness": "any"}
    one_by_one = {"keep_groups_whole": False}
    # when: datasets filter on the reward, one of them serving last_step
    dataset(admin, "high-last", filters={"reward_min": 0.5}, grouping={"reward_assignment": "last_step"})
    dataset(admin, "low", filters={"reward_max": 0.5})
    dataset(admin, "pending", filters={**any_steps, "reward_status": "pending"}, grouping=one_by_one)
    dataset(admin, "final", filters={**any_steps, "reward_status": "final"}, grouping=one_by_one)
    # then: the steps admitted by their stored effective reward (1.0), though served 0.0
    assert served(pull_all(trainer, "high-last", "c")) == [
        ("example:0", 0.0, "none", None),
        ("example:1", 0.0, "none", None),
        ("example:2", 1.0, "step", "env"),
    ]
    assert pull(trainer, "low", "c").json()["lease_id"] is None
    # and the provisional reward: served as its own, pending, reaching no other step
    assert served(pull_all(trainer, "pending", "c", unit="steps")) == [
        ("provisional:0", None, None, None),
        ("provisional:1", 0.9, "step", "env"),
    ]
    assert {r["reward_status"] for r in pull_all(trainer, "pending", "c2", unit="steps")} == {"pending"}
    assert [r["uid"] for r in pull_all(trainer, "final", "c", unit="steps")] == [
        "example:0",
        "example:1",
        "example:2",
    ]


# --- snapshots ------------------------------------------------------------------------------------
SNAPSHOT_COLUMNS = (
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_index",
    "prompt_ids",
    "response_ids",
    "rollout_logprobs",
    "token_rewards",
    "token_versions",
    "reward",
    "reward_source",
    "reward_scope",
    "outcome_reward",
    "process_reward",
    "policy_version",
    "token_source",
    "drift",
    "quality_flags",
    "readiness",
    "label",
    "tags",
    "feedback",
    "mask",
    "metadata",
    "images",
)
# The columns that are a step read's fields of the same name.
AS_READ = tuple(c for c in SNAPSHOT_COLUMNS if c not in ("tags", "feedback", "mask", "token_versions"))


def test_both_snapshot_files_hold_one_step_per_row_with_the_readme_columns(trainer, reader, mixed):
    """README: "Both files hold one step per line or row, with the same columns: uid,
    trajectory_uid, prompt_group_uid, step_index, prompt_ids, response_ids, rollout_logprobs,
    token_rewards, token_versions, reward, reward_source, reward_scope, outcome_reward,
    process_reward, policy_version, token_source, drift, quality_flags,
    readiness, label, tags, feedback, mask and metadata (in Parquet the token columns are
    list<int32> and metadata is a JSON string)." """
    # given: labels, tags and feedback on a step, feedback on its trajectory
    step = Step.objects.get(uid="g-r1:0")
    steps_label(step_ids=[step.id], actor="op", label="accepted", tags_add=["gold"])
    feedback_create(step_uid="g-r1:0", rating=4.0, comment="fine")
    feedback_create(trajectory_uid="g-r1", rating=2.0, label="long")
    # when: the dataset is snapshotted and both files downloaded
    resp = trainer.post("/api/v1/snapshots", {"dataset": "mixed"}, format="json")
    sid = resp.json()["id"]
    snapshot_build(snapshot_id=sid)
    jsonl_raw = b"".join(
        trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": "jsonl"}).streaming_content
    )
    table = pq.read_table(
        io.BytesIO(
            b"".join(
                trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": "parquet"}).streaming_content
            )
        )
    )
    jsonl = [orjson.loads(line) for line in jsonl_raw.splitlines()]
    # then: the README's columns (JSONL keys sorted, Parquet in the README's order)
    assert table.schema.names == list(SNAPSHOT_COLUMNS)
    assert all(list(row) == sorted(SNAPSHOT_COLUMNS) for row in jsonl)
    assert str(table.schema.field("prompt_ids").type) == str(table.schema.field("response_ids").type)
    assert str(table.schema.field("prompt_ids").type) == "list<element: int32>"
    assert str(table.schema.field("metadata").type) == "string"
    parquet = table.to_pylist()
    for row in parquet:
        row["metadata"] = orjson.loads(row["metadata"])
    assert parquet == jsonl
    # and one step per row: each the step as read, with its label, tags, feedback and mask
    assert [r["uid"] for r in jsonl] == mixed
    for row in jsonl:
        read = reader.get(f"/api/v1/steps/{row['uid']}").json()
        assert {c: row[c] for c in AS_READ} == {c: read[c] for c in AS_READ}, row["uid"]
    masks = {s["uid"]: s["mask"] for s in pull(trainer, "mixed", "c").json()["batch"]["steps"]}
    assert {r["uid"]: r["mask"] for r in jsonl} == masks
    by_uid = {r["uid"]: r for r in jsonl}
    assert by_uid["g-r1:0"]["tags"] == ["gold"] and by_uid["g-r1:0"]["label"] == "accepted"
    assert by_uid["g-r1:0"]["feedback"] == [
        {"rating": 4.0, "label": "", "correction": "", "comment": "fine"},
        {"rating": 2.0, "label": "long", "correction": "", "comment": ""},
    ]
    assert by_uid["g-r1:1"]["feedback"] == [{"rating": 2.0, "label": "long", "correction": "", "comment": ""}]
    assert by_uid["g-r0:0"]["tags"] == [] and by_uid["g-r0:0"]["feedback"] == []
    assert by_uid["g-r2:0"]["rollout_logprobs"] is None and by_uid["g-r2:0"]["policy_version"] is None


SETTINGS_PROBE = (
    "import django; django.setup(); from django.conf import settings; "
    "from django.core.files.storage import default_storage; "
    "print(settings.MEDIA_ROOT, default_storage.path('x'), settings.CLAW_SNAPSHOT_CHUNK_STEPS)"
)


def test_snapshot_files_go_to_the_default_storage_under_media_root():
    """README: "Files go to Django's default storage (MEDIA_ROOT, default var/media,
    CLAW_MEDIA_ROOT to move it)." (and the chunk size's default of 1,000 steps)"""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CLAW_")}
    base["DJANGO_SETTINGS_MODULE"] = "claw_site.settings.local"  # what manage.py serves

    def probe(**env) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", SETTINGS_PROBE],
            cwd=ROOT,
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    assert probe() == [str(ROOT / "var" / "media"), str(ROOT / "var" / "media" / "x"), "1000"]
    assert probe(CLAW_MEDIA_ROOT="/srv/claw-media")[:2] == ["/srv/claw-media", "/srv/claw-media/x"]


def test_a_snapshot_file_is_stored_in_the_default_storage(trainer, admin, media):
    """README: "Files go to Django's default storage (MEDIA_ROOT, default var/media,
    CLAW_MEDIA_ROOT to move it)." (where a built snapshot's files are)"""
    dataset(admin, "all")
    write("t", [(0, 1.0)])
    resp = trainer.post("/api/v1/snapshots", {"dataset": "all"}, format="json")
    snap = snapshot_build(snapshot_id=resp.json()["id"])
    for name in snap.files.values():
        path = default_storage.path(name)
        assert path.startswith(str(media)) and os.path.getsize(path) > 0


# --- dataset filters, grouping and builder --------------------------------------------------------
@pytest.fixture
def filter_world() -> str:
    """Lone trajectories, one per property a filter tells apart, policy version 2 current.
    Returns the time between the first ones and "late"."""
    rng = random.Random(0)
    a = api_key_create(name="agent-a", scopes=["ingest"])[0].source_id
    b = api_key_create(name="agent-b", scopes=["ingest"])[0].source_id

    def lone(
        uid: str,
        steps: int = 1,
        *,
        reward=1.0,
        source=a,
        channel=None,
        end=True,
        policy_version=2,
        logprobs=(-0.1, -0.2, -0.3),
        **extra,
    ) -> None:
        """``steps`` steps, the last one with ``reward`` (the others none of their own)."""
        ctx = random_ids(rng, 5)
        batch = []
        for i in range(steps):
            response = random_ids(rng, 3)
            last = i == steps - 1
            batch.append(
                step_in(
                    uid,
                    i,
                    prompt=list(ctx),
                    response=response,
                    reward=reward if last else None,
                    is_last=end and last,
                    policy_version=policy_version,
                    rollout_logprobs=list(logprobs) if logprobs is not None else None,
                    **extra,
                )
            )
            ctx = ctx + response
        steps_ingest(steps=batch, source_id=source, channel=channel)

    policy_version_set(version=1)
    lone("plain", 2)  # step 0 has no reward of its own: its branch's 1.0
    lone("val", channel="val")
    lone("src-b", source=b)
    lone("retok", token_source="retokenized")
    lone("old", policy_version=1)
    lone("low", 2, reward=0.0)
    lone("pending", reward=None)
    rewards_apply(rewards=[RewardIn(step_uid="pending:0", reward=0.3, final=False)])
    lone("running", end=False)
    lone("cut", finish_reason="length")
    lone("nolp", logprobs=None)
    lone("gold")
    lone("rejected")
    lone("rated")
    lone("rated-low")
    lone("by-trajectory", 2, reward=None, end=False)
    from pool.services.trajectories import trajectory_complete

    trajectory_complete(uid="by-trajectory", reward=0.25)
    steps_label(
        step_ids=Step.objects.filter(trajectory__uid="gold").values_list("id", flat=True),
        actor="op",
        label="accepted",
        tags_add=["gold"],
    )
    steps_label(
        step_ids=Step.objects.filter(trajectory__uid="rejected").values_list("id", flat=True),
        actor="op",
        label="rejected",
    )
    feedback_create(step_uid="rated:0", rating=4.0)
    feedback_create(trajectory_uid="rated-low", rating=1.0)
    mid = timezone.now()
    lone("late")
    policy_version_set(version=2)
    return mid.isoformat()


READY = {
    "plain",
    "val",
    "src-b",
    "old",
    "low",
    "cut",
    "nolp",
    "gold",
    "rated",
    "rated-low",
    "by-trajectory",
    "late",
}
EVERY = READY | {"retok", "pending", "running"}  # every stored step but the rejected one
FILTER_CASES = [
    ({}, READY),
    ({"readiness": "any"}, EVERY),
    ({"allow_retokenized": True}, READY | {"retok"}),
    ({"max_staleness": 0}, READY - {"old"}),
    ({"sources": ["agent-b"]}, {"src-b"}),
    ({"channel": "val"}, {"val"}),
    ({"channel": "train"}, READY - {"val"}),
    ({"created_after": "MID"}, {"late"}),
    ({"created_before": "MID"}, READY - {"late"}),
    ({"reward_status": "final"}, READY),
    # (issue 18) "running": its rewarded step is a process reward while the trajectory runs,
    # so it is not reward-final before its branch's outcome is known
    ({"readiness": "any", "reward_status": "final"}, EVERY - {"pending", "running"}),
    ({"readiness": "any", "reward_status": "pending"}, {"pending", "running"}),
    ({"reward_min": 0.5}, READY - {"low", "by-trajectory"}),
    ({"reward_max": 0.5}, {"low", "by-trajectory"}),
    ({"reward_min": 0.2, "reward_max": 0.3}, {"by-trajectory"}),
    ({"exclude_flags": ["truncated"]}, READY - {"cut"}),
    ({"require_flags": ["missing_logprobs"]}, {"nolp"}),
    ({"labels": ["accepted"]}, {"gold"}),
    ({"labels": ["none"]}, READY - {"gold"}),
    ({"exclude_labels": []}, READY | {"rejected"}),
    ({"exclude_labels": ["accepted"]}, READY - {"gold"} | {"rejected"}),
    ({"tags": ["gold"]}, {"gold"}),
    ({"exclude_tags": ["gold"]}, READY - {"gold"}),
    ({"token_sources": ["client"], "allow_retokenized": True}, READY),
    ({"token_sources": ["retokenized"], "allow_retokenized": True}, {"retok"}),
    ({"feedback": "with"}, {"rated", "rated-low"}),
    ({"feedback": "without"}, READY - {"rated", "rated-low"}),
    ({"min_rating": 3}, {"rated"}),
]


@pytest.mark.parametrize(
    ("filters", "expected"), FILTER_CASES, ids=[orjson.dumps(f).decode() for f, _ in FILTER_CASES]
)
def test_each_filter_admits_what_the_readme_says(trainer, admin, filter_world, filters, expected):
    """README: "Filters: readiness (ready, or any to explore), allow_retokenized,
    max_staleness, sources, channel, created_after/created_before, reward_status (final: the
    step is reward-final), reward_min/reward_max (the step's effective reward),
    exclude_flags/require_flags, labels/exclude_labels (default: rejected and quarantined are
    left out), tags/exclude_tags, token_sources, feedback (with/without), min_rating." """
    filters = {k: (filter_world if v == "MID" else v) for k, v in filters.items()}
    # given: a dataset of these filters serving steps one by one
    dataset(admin, "d", filters=filters, grouping={"keep_groups_whole": False})
    # when: a trainer pulls everything it admits
    steps = pull(trainer, "d", "c", unit="steps", batch_size=1000).json()["batch"]
    got = {s["trajectory_uid"] for s in steps["steps"]} if steps else set()
    # then: exactly the trajectories the filter describes, each with all of its steps
    assert got == expected
    if steps:
        want = Step.objects.filter(trajectory__uid__in=expected).count()
        assert len(steps["steps"]) == want


def test_a_preview_is_one_statement_on_the_steps_whatever_their_number(admin):
    """README: "A spec compiles to one aggregate statement (curation/selectors/specs.py), so a
    preview at 200k steps is one query." """
    table = Step._meta.db_table

    def statements(spec: dict) -> int:
        with CaptureQueriesContext(connection) as ctx:
            dataset_preview(spec_parse(spec))
        return sum(1 for q in ctx.captured_queries if table in q["sql"])

    spec = {"filters": {"reward_min": 0.5, "exclude_flags": ["truncated"], "tags": ["x"]}}
    for n in (1, 12):
        for g in range(n):
            ready_group(f"n{n}-g{g}")
        assert statements(spec) == 1
        assert statements({**spec, "grouping": {"keep_groups_whole": False}}) == 1


def test_the_dataset_builder_has_the_serving_rules_and_the_reward_assignment(django_user_model):
    """README: "Serving rules (optional, per dataset: "serving": {"stale_after": 2,
    "capacity": 500}, also fields of the dataset builder): stale_after drops a unit with a
    step more than that many policy versions behind the current one when it is offered (an
    off-policy bound; filters.max_staleness instead excludes stale steps from admission)."
    (the builder's part; tests/curation/test_serving_rules.py the rules)"""
    from tests.curation.test_pages import BUILDER, signed_in

    client = signed_in("operator")
    resp = client.post(
        "/curation/",
        {**BUILDER, "name": "fresh", "stale_after": "2", "capacity": "500", "reward_assignment": "last_step"},
    )
    assert resp.status_code == 302, resp.content
    from curation.models import Dataset

    spec = Dataset.objects.get(name="fresh").current.spec
    assert spec["serving"] == {
        "stale_after": 2,
        "stale_mode": "drop",  # the default: stale units are dropped
        "capacity": 500,
        # the serving order's defaults (specs.Serving), stored with every version
        "order": "oldest_ready",
        "priority": None,
        "reuse": None,
        "policy_mismatch_kl": None,  # trainers' verdicts flag nothing unless set
    }
    assert spec["grouping"]["reward_assignment"] == "last_step"
