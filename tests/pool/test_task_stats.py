"""Task statistics (pool/services/task_stats.py): every reward path reaches a task's
statistics exactly once per rollout, through the one registered effect of ready groups."""

from __future__ import annotations

import io
import re
import threading

import pytest
from django.db import connection, connections

from pool import bus
from pool.bus import GroupsReady
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, RewardFunction, Task, TaskSet
from pool.services import task_stats as stats_module
from pool.services.groups import group_upsert
from pool.services.readiness import groups_settle, readiness_sweep
from pool.services.reward_compute import group_rewards_compute
from pool.services.task_catalog import TaskIn, tasks_register
from tests.conftest import client_for
from tests.pool.factories import step_in

PROMPT = list(range(10, 42))
REWARDS = [1.0, 0.0, 1.0, 0.5]  # one group of four rollouts; the set passes at >= 1.0


def hand_stats(rewards: list[float], threshold: float = 1.0) -> dict:
    n = len(rewards)
    mean = sum(rewards) / n
    return {
        "rewarded": n,
        "passes": sum(r >= threshold for r in rewards),
        "pass_rate": sum(r >= threshold for r in rewards) / n,
        "mean_reward": mean,
        "reward_variance": sum((r - mean) ** 2 for r in rewards) / n,
        "informative_groups": int(max(rewards) != min(rewards)),
    }


def _steps(group: str, rewards: list[float], *, with_step_rewards: bool, outcome: bool = False) -> list[dict]:
    """Two steps per rollout; rewards on both (step rewards), on the last only (outcome), or none."""
    out = []
    for i, r in enumerate(rewards):
        traj = f"{group}-r{i}"
        first = {
            "trajectory_uid": traj,
            "prompt_group_uid": group,
            "step_index": 0,
            "prompt_ids": PROMPT,
            "response_ids": [1, 2, 3],
            "policy_version": 3,
        }
        last = {
            "trajectory_uid": traj,
            "prompt_group_uid": group,
            "step_index": 1,
            "is_last": True,
            "prompt_ids": PROMPT + [1, 2, 3, 9],
            "response_ids": [4, 5],
            "policy_version": 3,
        }
        if with_step_rewards:
            first["reward"] = r
            last["reward"] = r
        if outcome:
            last["reward"] = r
        out += [first, last]
    return out


def path_step_rewards(agent, group, rewards):
    return [
        agent.post("/api/v1/steps", {"steps": _steps(group, rewards, with_step_rewards=True)}, format="json")
    ]


def path_outcome_reward(agent, group, rewards):
    body = {"steps": _steps(group, rewards, with_step_rewards=False, outcome=True)}
    return [agent.post("/api/v1/steps", body, format="json")]


def path_trajectory_rewards(agent, group, rewards):
    posted = agent.post(
        "/api/v1/steps", {"steps": _steps(group, rewards, with_step_rewards=False)}, format="json"
    )
    body = {"rewards": [{"trajectory_uid": f"{group}-r{i}", "reward": r} for i, r in enumerate(rewards)]}
    return [posted, agent.post("/api/v1/rewards", body, format="json")]


def path_late_step_rewards(agent, group, rewards):
    posted = agent.post(
        "/api/v1/steps", {"steps": _steps(group, rewards, with_step_rewards=False)}, format="json"
    )
    body = {
        "rewards": [
            {"step_uid": f"{group}-r{i}:{k}", "reward": r} for i, r in enumerate(rewards) for k in (0, 1)
        ]
    }
    return [posted, agent.post("/api/v1/rewards", body, format="json")]


def path_computed(agent, group, rewards):
    """The gsm8k function scores each rollout's last response text against the ground truth."""
    RewardFunction.objects.create(name="gsm8k", path="pool.rewards.builtin.gsm8k")
    PromptGroup.objects.filter(uid=group).update(dataset="gsm8k", ground_truth="42")
    steps = _steps(group, rewards, with_step_rewards=False)
    for k, r in enumerate(rewards):
        steps[2 * k + 1]["response_text"] = "#### 42" if r >= 1.0 else "#### 41"
    posted = agent.post("/api/v1/steps", {"steps": steps}, format="json")
    group_rewards_compute(group_id=PromptGroup.objects.get(uid=group).id)
    return [posted]


PATHS = [  # (name, how the rewards arrive, the rewards that path can express)
    ("step rewards at submission", path_step_rewards, REWARDS),
    ("outcome reward of the last step", path_outcome_reward, REWARDS),
    ("trajectory rewards via /rewards", path_trajectory_rewards, REWARDS),
    ("late step rewards via /rewards", path_late_step_rewards, REWARDS),
    ("computed rewards (reward function)", path_computed, [1.0, 0.0, 1.0, 0.0]),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "path", "rewards"), PATHS, ids=[p[0] for p in PATHS])
def test_every_reward_path_reaches_the_task_stats_once_per_rollout(agent_key, name, path, rewards):
    # given a registered task and a group of four rollouts naming it
    agent = client_for(agent_key)
    assert (
        agent.post("/api/v1/tasks", {"tasks": [{"uid": "q1", "set": "math"}]}, format="json").status_code
        == 201
    )
    got = agent.post(
        "/api/v1/groups", {"uid": "g1", "expected_rollouts": len(rewards), "task": "q1"}, format="json"
    )
    assert got.status_code == 200, got.content
    # when the rollouts and their rewards arrive by this path
    for resp in path(agent, "g1", rewards):
        assert resp.status_code in (200, 201), resp.content
    # then the task's statistics are the hand-computed ones
    assert PromptGroup.objects.get(uid="g1").ready_at is not None
    listed = agent.get("/api/v1/tasks?uid=q1").json()["results"]
    assert len(listed) == 1
    stats = listed[0]["stats"]
    want = hand_stats(rewards)
    for key in ("rewarded", "passes", "informative_groups"):
        assert stats[key] == want[key], key
    assert stats["pass_rate"] == pytest.approx(want["pass_rate"])
    assert stats["mean_reward"] == pytest.approx(want["mean_reward"])
    assert stats["reward_variance"] == pytest.approx(want["reward_variance"])
    assert (stats["seen"], stats["attempted"], stats["completed"], stats["failed"]) == (1, 4, 4, 0)
    assert stats["last_policy_version"] == 3
    p = (want["passes"] + 1) / (len(rewards) + 2)  # Beta(1, 1)-smoothed recent pass rate
    assert stats["recent"]["pass_rate"] == pytest.approx(p)
    assert stats["recent"]["score"] == pytest.approx(p * (1 - p))
    # when every settle runs again (the sweep, a repeated settle of the ready group)
    group_id = PromptGroup.objects.get(uid="g1").id
    groups_settle(group_ids=[group_id])
    readiness_sweep()
    # then nothing is counted twice
    assert agent.get("/api/v1/tasks?uid=q1").json()["results"][0]["stats"] == stats


@pytest.mark.django_db
def test_groups_add_up_with_the_recent_window_decaying_by_policy_version(agent_key):
    # given a set with a half-life of 4 versions and a pass at 0.5
    agent = client_for(agent_key)
    tasks_register(tasks=[TaskIn(uid="q", set_name="s")])
    TaskSet.objects.filter(name="s").update(pass_threshold=0.5, window=4)
    groups = [(1, [0.0, 0.0, 0.0, 0.0]), (5, [1.0, 1.0, 0.0, 1.0]), (9, [1.0, 1.0, 1.0, 1.0])]
    # when three groups of policy versions 1, 5 and 9 are rolled out
    for k, (version, rewards) in enumerate(groups):
        gid = f"w{k}"
        assert (
            agent.post(
                "/api/v1/groups", {"uid": gid, "expected_rollouts": 4, "task": "q"}, format="json"
            ).status_code
            == 200
        )
        steps = [
            {
                "trajectory_uid": f"{gid}-{i}",
                "prompt_group_uid": gid,
                "step_index": 0,
                "is_last": True,
                "prompt_ids": PROMPT,
                "response_ids": [i],
                "reward": r,
                "policy_version": version,
            }
            for i, r in enumerate(rewards)
        ]
        assert agent.post("/api/v1/steps", {"steps": steps}, format="json").status_code == 201
    # then all-time sums are exact and the recent counts decayed by 0.5 per 4 versions
    t = Task.objects.get(uid="q")
    every = [r for _, rs in groups for r in rs]
    assert (t.seen, t.rewarded, t.passes, t.informative_groups) == (3, 12, 7, 1)
    assert t.reward_sum == pytest.approx(sum(every))
    assert t.reward_sumsq == pytest.approx(sum(r * r for r in every))
    recent_n = (4 * 0.5 + 4) * 0.5 + 4
    recent_p = (0 * 0.5 + 3) * 0.5 + 4
    assert t.recent_rewarded == pytest.approx(recent_n)
    assert t.recent_passes == pytest.approx(recent_p)
    assert t.recent_pass_rate == pytest.approx((recent_p + 1) / (recent_n + 2))
    assert t.last_policy_version == 9


@pytest.mark.django_db
def test_failed_rollouts_count_as_attempted_and_failed_not_rewarded(agent_key):
    # given a group of three rollouts of a task, one of which fails
    agent = client_for(agent_key)
    agent.post("/api/v1/groups", {"uid": "gf", "expected_rollouts": 3, "task": "tf"}, format="json")
    steps = [
        {
            "trajectory_uid": f"gf-{i}",
            "prompt_group_uid": "gf",
            "step_index": 0,
            "is_last": i < 2,
            "prompt_ids": PROMPT,
            "response_ids": [i],
            "reward": float(i),
        }
        for i in range(3)
    ]
    assert agent.post("/api/v1/steps", {"steps": steps}, format="json").status_code == 201
    # when the third is completed as failed
    resp = agent.post("/api/v1/trajectories/gf-2/complete", {"status": "failed"}, format="json")
    assert resp.status_code == 200, resp.content
    # then the task (created implicitly by the group) counts it
    t = Task.objects.get(uid="tf")
    assert (t.prompt, t.set_name) == (None, "")
    assert (t.seen, t.attempted, t.completed, t.failed, t.rewarded) == (1, 3, 2, 1, 2)
    assert (t.reward_sum, t.passes, t.informative_groups) == (1.0, 1, 1)


@pytest.mark.django_db
def test_the_effect_is_registered_once_for_ready_groups():
    assert bus._registry[GroupsReady].count(stats_module.groups_ready_task_stats) == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_groups_of_one_task_sum_correctly_on_postgresql():
    if connection.vendor != "postgresql":
        pytest.skip("row-lock concurrency is PostgreSQL's (SQLite serialises writers)")
    # given one task and 8 groups of 4 rollouts each, all naming it
    tasks_register(tasks=[TaskIn(uid="hot", set_name="c")])
    n_groups, rewards = 8, [1.0, 0.0, 1.0, 1.0]
    for g in range(n_groups):
        group_upsert(uid=f"c{g}", expected_rollouts=4, task="hot")
    errors: list[BaseException] = []
    barrier = threading.Barrier(n_groups)

    def roll(g: int) -> None:
        try:
            barrier.wait(timeout=10)
            steps_ingest(
                steps=[
                    step_in(
                        f"c{g}-{i}", 0, prompt=PROMPT, response=[i], group=f"c{g}", is_last=True, reward=r
                    )
                    for i, r in enumerate(rewards)
                ]
            )
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connections.close_all()

    # when their rollouts are written at once, from 8 threads
    threads = [threading.Thread(target=roll, args=(g,)) for g in range(n_groups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # then every group is counted once and the sums add up
    assert errors == []
    t = Task.objects.get(uid="hot")
    assert (t.seen, t.attempted, t.rewarded, t.passes) == (n_groups, 4 * n_groups, 4 * n_groups, 3 * n_groups)
    assert t.reward_sum == pytest.approx(3.0 * n_groups)
    assert t.informative_groups == n_groups


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_import_tasks_reads_jsonl_and_parquet_idempotently(tmp_path, fmt):
    import json

    from django.core.management import call_command

    # given a file of three tasks, one naming its own set
    rows = [
        {"uid": "a", "prompt": "p-a", "ground_truth": "1", "metadata": {"k": 1}},
        {"uid": "b", "prompt": "p-b", "ground_truth": "2", "metadata": {"k": 2}},
        {"uid": "c", "set": "other", "prompt": "p-c", "ground_truth": "3", "metadata": {"k": 3}},
    ]
    path = tmp_path / f"tasks.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table(
            {
                "uid": [r["uid"] for r in rows],
                "set": [r.get("set") for r in rows],
                "prompt": [r["prompt"] for r in rows],
                "ground_truth": [r["ground_truth"] for r in rows],
                "metadata": [r["metadata"] for r in rows],
            }
        )
        pq.write_table(table, path)
    out = io.StringIO()
    # when it is imported twice with --set train
    call_command("import_tasks", str(path), "--set", "train", "--batch", "2", stdout=out)
    call_command("import_tasks", str(path), "--set", "train", stdout=out)
    # then the tasks are shared, in their sets, field by field, and the repeat changed nothing
    got = {t.uid: t for t in Task.objects.all()}
    assert sorted(got) == ["a", "b", "c"]
    for r in rows:
        t = got[r["uid"]]
        assert (t.source_id, t.set_name, t.prompt, t.ground_truth, t.metadata) == (
            None,
            r.get("set") or "train",
            r["prompt"],
            r["ground_truth"],
            r["metadata"],
        )
    text = out.getvalue()
    assert "imported 3 rows: 3 created, 0 updated, 0 unchanged" in text
    assert "imported 3 rows: 0 created, 0 updated, 3 unchanged" in text
    assert "  2 rows:" in text  # progress per batch


@pytest.mark.django_db
def test_a_group_that_names_its_task_after_it_is_ready_is_counted_once(agent_key):
    # given a ready group of two rewarded rollouts that named no task
    agent = client_for(agent_key)
    agent.post("/api/v1/groups", {"uid": "late", "expected_rollouts": 2}, format="json")
    steps = [
        {
            "trajectory_uid": f"late-{i}",
            "prompt_group_uid": "late",
            "step_index": 0,
            "is_last": True,
            "prompt_ids": PROMPT,
            "response_ids": [i],
            "reward": float(i),
        }
        for i in range(2)
    ]
    assert agent.post("/api/v1/steps", {"steps": steps}, format="json").status_code == 201
    assert PromptGroup.objects.get(uid="late").ready_at is not None
    # when it names its task, twice
    for _ in range(2):
        assert agent.post("/api/v1/groups", {"uid": "late", "task": "tl"}, format="json").status_code == 200
    # then the task counts the group once
    t = Task.objects.get(uid="tl")
    assert (t.seen, t.rewarded, t.passes, t.informative_groups) == (1, 2, 1, 1)


@pytest.mark.django_db
def test_ready_groups_cost_one_claim_and_groups_without_an_uncounted_task_cost_nothing():
    """The effect's statements: one claim for every ready group naming a task, one UPDATE
    per task, and none at all for ready groups of no task or counted already."""
    from django.test.utils import CaptureQueriesContext

    def task_statements(ctx) -> list[str]:
        """The statements on tasks, and those reading or claiming uncounted groups (the
        readiness read only lists task_counted_at among its columns)."""
        return [
            q["sql"]
            for q in ctx.captured_queries
            if '"pool_task"' in q["sql"] or re.search(r'task_counted_at"? IS NULL', q["sql"])
        ]

    # given one task, three groups of two rollouts naming it and two groups naming none
    tasks_register(tasks=[TaskIn(uid="one-claim", set_name="oc")])
    tasked, plain = [f"tg{g}" for g in range(3)], [f"pg{g}" for g in range(2)]
    for uid in tasked:
        group_upsert(uid=uid, expected_rollouts=2, task="one-claim")
    for uid in plain:
        group_upsert(uid=uid, expected_rollouts=2)

    def rollouts(groups, reward):
        return [
            step_in(f"{g}-{i}", 0, prompt=PROMPT, response=[i], group=g, is_last=True, reward=reward)
            for g in groups
            for i in range(2)
        ]

    # when the plain groups' rollouts make them ready
    with CaptureQueriesContext(connection) as ctx:
        steps_ingest(steps=rollouts(plain, 1.0))
    # then the task statistics ran no statement
    assert PromptGroup.objects.filter(uid__in=plain, ready_at__isnull=False).count() == 2
    assert task_statements(ctx) == []
    # when the three tasked groups become ready in one write
    with CaptureQueriesContext(connection) as ctx:
        steps_ingest(steps=rollouts(tasked, 1.0))
    # then one claim took all three and one UPDATE counted them into the task
    claims = [s for s in task_statements(ctx) if "task_counted_at" in s]
    assert len(claims) == 1, claims
    updates = [s for s in task_statements(ctx) if s.lstrip().upper().startswith('UPDATE "POOL_TASK"')]
    assert len(updates) == 1, updates
    t = Task.objects.get(uid="one-claim")
    assert (t.seen, t.attempted, t.rewarded, t.passes) == (3, 6, 6, 6)
    # when every group is settled again (GroupsReady repeats for ready groups)
    ids = list(PromptGroup.objects.filter(uid__in=tasked + plain).values_list("id", flat=True))
    with CaptureQueriesContext(connection) as ctx:
        groups_settle(group_ids=ids)
    # then nothing is counted twice, and the effect ran no statement
    assert task_statements(ctx) == []
    t.refresh_from_db()
    assert (t.seen, t.attempted, t.rewarded, t.passes) == (3, 6, 6, 6)
