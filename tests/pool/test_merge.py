"""Prefix-tree merge results: enqueue on group completion, the tasks, idempotency, the API,
the admin and the dashboard card. Real database, real HTTP stack (DRF test client).

README: "A Celery task merges a prompt group when it completes (idempotent, stored as a
MergeResult); the API serves stats and nodes at GET /api/v1/groups/{uid}/prefix-tree; the
dashboard shows the token savings." """

from __future__ import annotations

import json
import random

import pytest

from claw_client import PrefixTree
from pool import tasks
from pool.models import MergeResult, PromptGroup, Step
from pool.services import merge
from tests.conftest import client_for, make_step, post_steps

pytestmark = pytest.mark.django_db

PROMPT, ANSWER, OBSERVATION = 40, 6, 9


def agentic_group(uid: str, *, rollouts: int = 2, turns: int = 3, seed: int = 0) -> list[dict]:
    """A small agentic group: shared prompt, each turn's prompt extends the previous one."""
    rng = random.Random(seed)
    system = [rng.randrange(150_000) for _ in range(PROMPT)]
    steps = []
    for r in range(rollouts):
        ctx = list(system)
        for t in range(turns):
            resp = [rng.randrange(150_000) for _ in range(ANSWER)]
            steps.append(
                {
                    "uid": f"{uid}-r{r}-s{t}",
                    "trajectory_uid": f"{uid}-r{r}",
                    "prompt_group_uid": uid,
                    "step_index": t,
                    "prompt_ids": ctx,
                    "response_ids": resp,
                }
            )
            ctx = ctx + resp + [rng.randrange(150_000) for _ in range(OBSERVATION)]
    return steps


def unique_tokens(steps: list[dict]) -> int:
    """Brute force: distinct non-empty prefixes."""
    return len(
        {
            tuple((s["prompt_ids"] + s["response_ids"])[: d + 1])
            for s in steps
            for d in range(len(s["prompt_ids"]) + len(s["response_ids"]))
        }
    )


def submit_group(agent, uid: str, steps: list[dict], *, expected: int) -> None:
    assert (
        agent.post("/api/v1/groups", {"uid": uid, "expected_rollouts": expected}, format="json").status_code
        == 200
    )
    assert post_steps(agent, steps).status_code == 201


class Recorder:
    """Stands in for Task.apply_async (the broker boundary): records the task's arguments."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, args=(), kwargs=None, **options):
        self.calls.append(tuple(args))


def test_a_write_completing_many_groups_sends_their_follow_up_in_chunks(
    agent, monkeypatch, django_capture_on_commit_callbacks
):
    # given 20 groups of one rollout each, declared
    uids = [f"many{i:02d}" for i in range(20)]
    for uid in uids:
        assert (
            agent.post("/api/v1/groups", {"uid": uid, "expected_rollouts": 1}, format="json").status_code
            == 200
        )
    merges, rewards = Recorder(), Recorder()
    monkeypatch.setattr(tasks.groups_merge, "apply_async", merges)
    monkeypatch.setattr(tasks.groups_rewards_compute, "apply_async", rewards)
    # when one write ends every rollout (each completes its group)
    steps = [make_step(f"{uid}-r0", 0, group=uid, is_last=True, reward=1.0) for uid in uids]
    with django_capture_on_commit_callbacks(execute=True):
        assert post_steps(agent, steps).status_code == 201
    # then each follow-up task is sent once per FOLLOW_UP_CHUNK groups, every group once, in order
    ids = [PromptGroup.objects.get(uid=uid).id for uid in uids]
    assert tasks.FOLLOW_UP_CHUNK == 16
    assert merges.calls == rewards.calls == [(ids[:16],), (ids[16:],)]
    # and a worker running them merges every group
    for call in merges.calls:
        tasks.groups_merge.apply(args=json.loads(json.dumps(list(call)))).get()
    assert set(
        MergeResult.objects.filter(status=MergeResult.Status.DONE).values_list("group_id", flat=True)
    ) == set(ids)


def test_group_completion_enqueues_merge_on_commit_and_task_stores_exact_stats(
    agent, django_capture_on_commit_callbacks, monkeypatch
):
    # given a group of 2 rollouts whose steps are stored and whose first rollout has ended
    steps = agentic_group("gm1")
    submit_group(agent, "gm1", steps, expected=2)
    assert agent.post("/api/v1/trajectories/gm1-r0/complete", {}, format="json").status_code == 200
    group = PromptGroup.objects.get(uid="gm1")
    assert group.status == PromptGroup.Status.OPEN
    sent = Recorder()
    monkeypatch.setattr(tasks.groups_merge, "apply_async", sent)
    # when the last rollout completes (callbacks held until "commit")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert (
            agent.post("/api/v1/trajectories/gm1-r1/complete", {"reward": 1.0}, format="json").status_code
            == 200
        )
    # then nothing was enqueued before commit, and the commit enqueues exactly this group's merge
    assert sent.calls == [] and not MergeResult.objects.exists()
    for callback in callbacks:
        callback()
    assert sent.calls == [([group.id],)]
    # when a worker runs the task with the (JSON round-tripped) arguments
    tasks.groups_merge.apply(args=json.loads(json.dumps(list(sent.calls[0])))).get()
    # then the stored result has the exact stats of a brute-force trie
    result = MergeResult.objects.get(key="group:gm1")
    total = sum(len(s["prompt_ids"]) + len(s["response_ids"]) for s in steps)
    assert result.status == MergeResult.Status.DONE
    assert result.group_id == group.id
    assert (result.n_sequences, result.total_tokens, result.unique_tokens) == (
        len(steps),
        total,
        unique_tokens(steps),
    )
    assert result.unique_tokens == PROMPT + 2 * (3 * ANSWER + 2 * OBSERVATION)
    assert result.stats["savings"] == pytest.approx(1 - result.unique_tokens / total)
    # and the stored layout rebuilds every step exactly, with its response as loss tokens
    tree, extra = PrefixTree.from_bytes(bytes(result.layout))
    by_id = dict(Step.objects.filter(trajectory__group=group).values_list("id", "uid"))
    submitted = {s["uid"]: s for s in steps}
    for i, step_id in enumerate(extra["step_ids"].tolist()):
        s = submitted[by_id[step_id]]
        assert tree.input_ids[tree.sequence_indices(i)].tolist() == s["prompt_ids"] + s["response_ids"]
        assert tree.input_ids[tree.response_indices(i)].tolist() == s["response_ids"]


def test_merge_is_idempotent_and_recomputes_when_the_group_changes(agent):
    # given a merged group
    steps = agentic_group("gm2", rollouts=1)
    submit_group(agent, "gm2", steps, expected=2)
    group = PromptGroup.objects.get(uid="gm2")
    first = merge.group_merge_compute(group_id=group.id)
    # when the task runs again on unchanged input
    tasks.group_merge.apply(args=[group.id]).get()
    # then it skipped: the row was not rewritten
    again = MergeResult.objects.get(key="group:gm2")
    assert again.updated_at == first.updated_at
    assert bytes(again.input_hash) == bytes(first.input_hash)
    # when another rollout arrives, the next run recomputes
    more = agentic_group("gm2", rollouts=2)[3:]
    for s in more:
        s["uid"] += "-late"
    assert post_steps(agent, more).status_code == 201
    tasks.group_merge.apply(args=[group.id]).get()
    fresh = MergeResult.objects.get(key="group:gm2")
    assert fresh.n_sequences == len(steps) + len(more)
    assert fresh.unique_tokens == unique_tokens(steps + more)
    assert bytes(fresh.input_hash) != bytes(first.input_hash)
    assert MergeResult.objects.filter(key="group:gm2").count() == 1


def test_group_merge_of_a_vanished_group_is_a_no_op():
    tasks.group_merge.apply(args=[987654]).get()
    assert not MergeResult.objects.exists()


def test_steps_merge_task_merges_a_batch_under_its_key(
    agent, django_capture_on_commit_callbacks, monkeypatch
):
    # given steps of two groups, picked as a batch in a chosen order
    a, b = agentic_group("gb1", seed=1), agentic_group("gb2", seed=2)
    assert post_steps(agent, a + b).status_code == 201
    ids = list(
        Step.objects.filter(uid__in=[a[0]["uid"], b[2]["uid"], a[5]["uid"]]).values_list("id", flat=True)
    )
    sent = Recorder()
    monkeypatch.setattr(tasks.steps_merge, "apply_async", sent)
    # when its merge is requested, it is enqueued on commit
    with django_capture_on_commit_callbacks(execute=True):
        merge.steps_merge_enqueue(key="batch:7", step_ids=ids)
    assert sent.calls == [("batch:7", ids)]
    # and when the task runs it stores the merge under the batch key
    tasks.steps_merge.apply(args=json.loads(json.dumps(list(sent.calls[0])))).get()
    result = MergeResult.objects.get(key="batch:7")
    picked = [s for s in a + b if s["uid"] in {a[0]["uid"], b[2]["uid"], a[5]["uid"]}]
    assert result.group_id is None
    assert (result.n_sequences, result.unique_tokens) == (3, unique_tokens(picked))
    # and a batch naming a step that no longer exists stores nothing
    tasks.steps_merge.apply(args=["batch:8", [*ids, 10**9]]).get()
    assert not MergeResult.objects.filter(key="batch:8").exists()


def test_prefix_tree_api_serves_stats_and_nodes(agent, reader):
    # given a complete, merged group
    steps = agentic_group("ga1")
    submit_group(agent, "ga1", steps, expected=2)
    for r in (0, 1):
        agent.post(f"/api/v1/trajectories/ga1-r{r}/complete", {}, format="json")
    merge.group_merge_compute(group_id=PromptGroup.objects.get(uid="ga1").id)
    # when a reader asks for its prefix tree
    resp = reader.get("/api/v1/groups/ga1/prefix-tree")
    # then it gets the stats...
    assert resp.status_code == 200, resp.content
    body = resp.json()
    total = sum(len(s["prompt_ids"]) + len(s["response_ids"]) for s in steps)
    assert body["status"] == "done"
    assert (body["total_tokens"], body["unique_tokens"]) == (total, unique_tokens(steps))
    assert body["ratio"] == pytest.approx(body["unique_tokens"] / total)
    assert body["savings"] == pytest.approx(1 - body["ratio"])
    # ...and radix nodes that rebuild every step: its tokens are those of the nodes listing it
    nodes = body["nodes"]
    assert set(nodes[0]) >= {"id", "parent", "start", "length", "tokens", "truncated", "steps", "size"}
    assert nodes[0]["parent"] is None and nodes[0]["size"] == body["unique_tokens"]
    assert sorted(nodes[0]["steps"]) == sorted(s["uid"] for s in steps)  # the shared prompt
    assert sum(n["length"] for n in nodes) == body["unique_tokens"]
    for s in steps:
        mine = [n for n in nodes if s["uid"] in n["steps"]]
        assert not any(n["truncated"] for n in mine)
        assert [t for n in mine for t in n["tokens"]] == s["prompt_ids"] + s["response_ids"]


def test_prefix_tree_api_merges_small_groups_on_demand_and_defers_large_ones(
    agent, reader, django_capture_on_commit_callbacks, monkeypatch
):
    # given a stored group that was never merged
    submit_group(agent, "ga2", agentic_group("ga2", seed=3), expected=2)
    assert not MergeResult.objects.exists()
    # when it is read, it is merged during the request
    resp = reader.get("/api/v1/groups/ga2/prefix-tree")
    assert resp.status_code == 200 and resp.json()["status"] == "done"
    assert MergeResult.objects.get(key="group:ga2").status == MergeResult.Status.DONE
    # given a group above the synchronous limit
    submit_group(agent, "ga3", agentic_group("ga3", seed=4), expected=2)
    monkeypatch.setattr(merge, "MERGE_SYNC_MAX_TOKENS", 10)
    sent = Recorder()
    monkeypatch.setattr(tasks.group_merge, "apply_async", sent)
    # when it is read, the answer is 202 pending and its merge is enqueued on commit
    with django_capture_on_commit_callbacks(execute=True):
        resp = reader.get("/api/v1/groups/ga3/prefix-tree")
    assert resp.status_code == 202
    assert resp.json()["status"] == "pending" and resp.json()["nodes"] == []
    assert sent.calls == [(PromptGroup.objects.get(uid="ga3").id,)]
    # and once the worker has run, the same read serves the result
    tasks.group_merge.apply(args=list(sent.calls[0])).get()
    assert reader.get("/api/v1/groups/ga3/prefix-tree").status_code == 200


def test_a_group_without_steps_merges_to_an_empty_tree(agent, reader):
    assert (
        agent.post("/api/v1/groups", {"uid": "ge1", "expected_rollouts": 2}, format="json").status_code == 200
    )
    body = reader.get("/api/v1/groups/ge1/prefix-tree").json()
    assert (body["status"], body["total_tokens"], body["unique_tokens"], body["nodes"]) == ("done", 0, 0, [])


def test_corrupt_stored_tokens_fail_the_merge_once(agent, reader):
    # given a group one of whose stored deltas has been truncated to a partial token
    submit_group(agent, "gc1", agentic_group("gc1", rollouts=1), expected=1)
    Step.objects.filter(uid="gc1-r0-s0").update(seq_delta=b"\x01\x02\x03")
    group = PromptGroup.objects.get(uid="gc1")
    # when it is merged
    failed = merge.group_merge_compute(group_id=group.id)
    # then the failure is stored with its reason, and the API reports it
    assert failed.status == MergeResult.Status.FAILED and "whole number" in failed.error
    body = reader.get("/api/v1/groups/gc1/prefix-tree").json()
    assert body["status"] == "failed" and body["nodes"] == [] and body["error"]
    # and the same input is not retried (it would fail the same way)
    assert merge.group_merge_compute(group_id=group.id).updated_at == failed.updated_at


def test_node_tokens_are_truncated_for_display(agent):
    submit_group(agent, "ga4", agentic_group("ga4"), expected=2)
    result = merge.group_merge_ensure(uid="ga4")
    body = merge.merge_tree_render(result, node_tokens=5)
    root = body["nodes"][0]
    assert root["length"] == PROMPT and root["truncated"] is True and len(root["tokens"]) == 5


def test_prefix_tree_api_auth_and_unknown_group(trainer_key, reader):
    # every scope may read (read, ingest, consume, admin); without a valid key it is 401
    assert client_for(None).get("/api/v1/groups/x/prefix-tree").status_code == 401
    assert client_for("claw_nope_nope").get("/api/v1/groups/x/prefix-tree").status_code == 401
    assert client_for(trainer_key).get("/api/v1/groups/x/prefix-tree").status_code == 404
    resp = reader.get("/api/v1/groups/nope/prefix-tree")
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "not_found_error"


def test_admin_and_dashboard_show_the_savings(agent, client, operator):
    # given a merged group
    steps = agentic_group("gd1")
    submit_group(agent, "gd1", steps, expected=2)
    result = merge.group_merge_ensure(uid="gd1")
    client.force_login(operator)
    # then the admin list and detail pages load and show the savings
    page = client.get("/admin/pool/mergeresult/")
    assert page.status_code == 200
    assert f"{result.savings:.1%}" in page.content.decode()
    detail = client.get(f"/admin/pool/mergeresult/{result.id}/change/")
    assert detail.status_code == 200
    assert "stored layout" in detail.content.decode().lower() and result.key in detail.content.decode()
    # and the dashboard card shows the percentage saved
    home = client.get("/")
    assert home.status_code == 200
    assert f"{round(result.savings * 100)}% saved" in home.content.decode()
