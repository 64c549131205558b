"""Every ingest promise on every door: white-box JSON and MessagePack batches, Claw-R1's
submit_steps, and proxied calls on the fast and the general path (tests/pool/ingest_doors.py).

The doors must store the same rows for the same logical trajectory: the white-box JSON
door's rows are the reference, and every other door's rows are compared with them column by
column (all concrete fields of Step, Trajectory, PromptGroup and PolicyVersion), except the
short list of columns in EXEMPT that legitimately differ, each with its reason. The token
columns (seq_parent, seq_shared, seq_delta, seq_len, prompt_len, seq_depth, seq_hash,
rollout_logprobs) are never exempt: that is the prefix-dedup promise.

Written before the one write pipeline, this suite found three differences between doors
(the parents of n > 1 choices, a proxied call's policy version, Claw-R1's unchecked uid
length); the pipeline removed them, and the suite keeps them out.

Statement counts are taken at the database driver (tests/pool/statements.py), because
Django's query log misses what goes over the raw psycopg connection (COPY, the proxy's CTE).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from typing import Any

import numpy as np
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction
from django.test import Client

from pool import live
from pool.models import ApiKey, Event, PolicyVersion, PromptGroup, Step, Trajectory
from tests.pool.factories import pool_counts
from tests.pool.ingest_doors import (
    DOORS,
    PROXIED,
    WHITE_BOX,
    Door,
    ProxyDoor,
    Rollout,
    WhiteBoxDoor,
    differences,
    group_prompt,
    read_back,
    rollout,
    snapshot,
    stored_ids,
)
from tests.pool.statements import sql_statements

pytestmark = pytest.mark.django_db

# Columns that legitimately differ from the white-box JSON door's: (table, column) -> reason.
EXEMPT_ALWAYS = {
    ("Step", "id"): "surrogate key (references are compared as what they point at)",
    ("Trajectory", "id"): "surrogate key",
    ("PromptGroup", "id"): "surrogate key",
    ("Step", "created_at"): "wall-clock time of the write",
    ("Step", "updated_at"): "wall-clock time of the write",
    ("Trajectory", "created_at"): "wall-clock time of the write",
    ("Trajectory", "updated_at"): "wall-clock time of the write",
    ("Trajectory", "completed_at"): "wall-clock time of the write",
    ("PromptGroup", "created_at"): "wall-clock time of the write",
    ("PromptGroup", "completed_at"): "wall-clock time of the write",
    ("PolicyVersion", "created_at"): "wall-clock time of the write",
    ("Step", "content_hash"): "fingerprints the submission, uids included (fresh per door run)",
}
_PROXIED_EXEMPT = {
    ("Step", "token_source"): "the inference server returned the ids: 'upstream', not 'client'",
    ("Step", "metadata"): "the proxy records the call (endpoint, model, params)",
    ("Trajectory", "reward"): "complete_trajectory rewards the trajectory too; an is_last step only itself",
    ("Step", "readiness"): "a trajectory reward makes every step's reward final (the Trajectory.reward line)",
    ("Step", "ready"): "read form of readiness (the line above)",
    ("Step", "parent_step_id"): "a proxied chat call links the step it continues (gateway/proxy/branches.py)",
    ("Step", "parent_step_uid"): "read form of parent_step_id (the line above)",
}
EXEMPT: dict[str, dict[tuple[str, str], str]] = {
    "json": {},
    "msgpack": {},
    "claw_r1": {
        ("Step", "messages"): "Claw-R1's StepPayload has no messages",
        ("Step", "response_text"): "Claw-R1's StepPayload has no response_text",
        ("Step", "finish_reason"): "Claw-R1's StepPayload has no finish_reason",
    },
    "proxy_fast": _PROXIED_EXEMPT,
    "proxy_named": _PROXIED_EXEMPT,
    "proxy_general": _PROXIED_EXEMPT,
    "proxy_group": _PROXIED_EXEMPT,
}

# Policy versions are unique per test: the proxy remembers, per process, which versions exist.
_versions = itertools.count(1_000_001)


def scenario(name: str) -> list[Rollout]:
    """The logical trajectories of a scenario (fresh policy versions every call)."""
    v, newer = next(_versions), next(_versions)
    prompt = group_prompt()
    if name == "group":  # two rollouts of one prompt, three turns each
        return [
            rollout("a", group="g", prompt=prompt, turns=3, reward=1.0, versions=v, seed=1),
            rollout("b", group="g", prompt=prompt, turns=3, reward=0.0, versions=v, seed=2),
        ]
    if name == "group_of_3":  # three rollouts of one prompt, no policy version: the proxy
        # creates the group with the first rollout's call, reads the anchor with the second's and
        # stores the third's first step against it in the fast path's statement
        return [
            rollout(r, group="g", prompt=prompt, turns=2, reward=float(i), versions=None, seed=10 + i)
            for i, r in enumerate("abc")
        ]
    if name == "solo":  # no group, no policy version: the proxy's fast path from the first call
        return [rollout("s", group=None, prompt=prompt, turns=3, reward=0.5, versions=None, seed=3)]
    if name == "choices":  # n = 2, then n = 3, each next turn continuing the first choice
        return [
            rollout(
                "c", group=None, prompt=prompt, turns=3, reward=0.5, versions=v, seed=4, choices={0: 2, 1: 3}
            )
        ]
    if name == "policy_bump":  # the policy moves on during the trajectory
        return [rollout("p", group=None, prompt=prompt, turns=3, reward=0.5, versions=[v, v, newer], seed=5)]
    if name == "long_chain":  # past pool.tokens.MAX_CHAIN_DEPTH (64): one step stored whole
        return [rollout("l", group=None, prompt=prompt, turns=67, reward=0.5, versions=None, seed=6)]
    raise AssertionError(name)


SCENARIOS = ("group", "group_of_3", "solo", "choices", "policy_bump", "long_chain")
CASES = [pytest.param(s, d, id=f"{s}-{d}") for s in SCENARIOS for d in DOORS]


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def enqueued(monkeypatch) -> list[tuple]:
    """Records the prefix-tree merges' publications (the broker boundary: pool.tasks.groups_merge,
    what a completion sends, and pool.tasks.group_merge) instead of sending."""
    calls: list[tuple] = []
    for name in ("groups_merge", "group_merge"):
        monkeypatch.setattr(
            f"pool.tasks.{name}.apply_async",
            lambda args=(), kwargs=None, **kw: calls.append((tuple(args), kwargs or {})),
        )
    return calls


@pytest.fixture(autouse=True)
def gateway_db_on_the_test_thread(monkeypatch):
    """The async gateway views (Claw-R1, key checks) run their database work on
    gateway.proxy.db's thread pool, whose connections cannot see this test's transaction.
    Here it runs on the test's own thread and connection instead (sync_to_async hops back to
    it from the test client's event loop), so these doors are tested on the test database
    and their statements are counted. The one place this suite patches gateway internals:
    adapt the two names if run_db moves."""

    async def run_db(fn, /, *args, **kwargs):
        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)

    monkeypatch.setattr("gateway.compat.claw_r1.run_db", run_db)
    monkeypatch.setattr("gateway.proxy.access.run_db", run_db)


@pytest.fixture
def door_of(agent, agent_key, django_capture_on_commit_callbacks):
    """door_of(name): a fresh door (fresh uids) writing with the agent's ingest key."""
    source_id = ApiKey.objects.get(prefix=agent_key.split("_")[1]).source_id

    def make(name: str) -> Door:
        return DOORS[name](name, agent, agent_key, source_id, django_capture_on_commit_callbacks)

    return make


def reference(door_of, rollouts: list[Rollout]) -> tuple[dict, dict]:
    """The rows and reads the white-box JSON door stores for ``rollouts``, written in a
    savepoint that is then rolled back, so the door under test starts from the same empty
    pool (and creates the same group and policy version rows on first sight)."""
    with transaction.atomic():
        door = door_of("json")
        for r in rollouts:
            door.write(r)
        rows, reads = snapshot(door, rollouts), read_back(door, rollouts)
        transaction.set_rollback(True)
    return rows, reads


# --- 1. the same rows through every door ----------------------------------------------------------
@pytest.mark.parametrize(("scenario_name", "door_name"), CASES)
def test_every_door_stores_the_json_doors_rows_and_reads_back_exactly(door_of, scenario_name, door_name):
    # given: the logical trajectories, and the rows the white-box JSON door stores for them
    # and what its steps read back as
    rollouts = scenario(scenario_name)
    expected_rows, expected_reads = reference(door_of, rollouts)

    # when: they go through the door under test
    door = door_of(door_name)
    for r in rollouts:
        door.write(r)

    # then: every column matches, but for the exempt ones
    exempt = EXEMPT_ALWAYS.keys() | EXEMPT[door_name].keys()
    assert differences(expected_rows, snapshot(door, rollouts), exempt) == []
    # and: the token ids rebuilt from the stored deltas are exactly the written ones
    got = read_back(door, rollouts)
    for r in rollouts:
        assert stored_ids(door, r) == [t.prompt + t.choices[c].response for _, t, c in r.steps()]
        for index, t, c in r.steps():
            step = got[(r.name, index)]
            assert (step["prompt_ids"], step["response_ids"]) == (t.prompt, t.choices[c].response)
            assert step["rollout_logprobs"] == t.choices[c].logprobs  # float64, bit-exact
            assert step["policy_version"] == t.policy_version
    # and: GET /api/v1/steps/<uid> answers what it answers for the JSON door's steps
    exempt = {"created_at"} | {column for table, column in EXEMPT[door_name] if table == "Step"}
    assert {key: {k: v for k, v in body.items() if k not in exempt} for key, body in got.items()} == {
        key: {k: v for k, v in body.items() if k not in exempt} for key, body in expected_reads.items()
    }


# --- 2. single promises, per door ----------------------------------------------------------------
@pytest.mark.parametrize("door_name", list(DOORS))
def test_trajectory_group_and_policy_version_are_created_on_first_sight(door_of, door_name):
    # given: an empty pool
    [a, _] = scenario("group")
    version = a.turns[0].policy_version
    assert not PolicyVersion.objects.filter(version=version).exists()

    # when: the first turn of a rollout arrives
    door = door_of(door_name)
    door.write_turns(a, [0], end=False)

    # then: its trajectory, group and policy version exist, the trajectory in the group
    traj = Trajectory.objects.select_related("group").get(uid=door.uid("a"))
    assert traj.group.uid == door.uid("g")
    assert (traj.policy_version_id, traj.source_id) == (version, door.source_id)
    assert PolicyVersion.objects.filter(version=version).exists()
    assert (traj.status, traj.step_count) == (Trajectory.Status.RUNNING, 1)


@pytest.mark.parametrize("door_name", list(DOORS))
def test_step_count_follows_the_steps_and_the_end_completes_the_trajectory(door_of, door_name):
    # given: a rollout of three turns
    [a, _] = scenario("group")
    door = door_of(door_name)

    # when: two turns arrive
    door.write_turns(a, [0, 1], end=False)

    # then: it runs, with two steps and no last step
    traj = Trajectory.objects.get(uid=door.uid("a"))
    assert (traj.status, traj.step_count, traj.completed_at) == (Trajectory.Status.RUNNING, 2, None)
    assert not Step.objects.filter(trajectory=traj, is_last=True).exists()

    # when: the last turn arrives and the trajectory ends (is_last step, or complete_trajectory)
    door.write_turns(a, [2], end=True)

    # then: it is complete with three steps, the last one is_last with the final reward
    traj.refresh_from_db()
    assert (traj.status, traj.step_count) == (Trajectory.Status.COMPLETED, 3)
    assert traj.completed_at is not None
    last = Step.objects.get(trajectory=traj, is_last=True)
    assert (last.step_index, last.reward, last.reward_status) == (2, 1.0, Step.RewardStatus.FINAL)


@pytest.mark.parametrize("door_name", list(DOORS))
def test_group_anchor_and_turns_are_stored_as_deltas(door_of, door_name):
    # given: two rollouts of one group prompt (40 tokens), three turns each
    a, b = scenario("group")
    door = door_of(door_name)

    # when: they arrive one after the other
    door.write(a)
    door.write(b)

    # then: the group's anchor is the first rollout's step 0
    steps = {
        (s.trajectory.uid, s.step_index): s
        for s in Step.objects.filter(trajectory__group__uid=door.uid("g")).select_related("trajectory")
    }
    a0 = steps[(door.uid("a"), 0)]
    assert PromptGroup.objects.get(uid=door.uid("g")).anchor_step_id == a0.id
    assert (a0.seq_parent_id, a0.seq_shared, a0.seq_depth) == (None, 0, 0)
    # and: the other rollout's first step is a delta against the anchor (the shared prompt)
    b0 = steps[(door.uid("b"), 0)]
    assert (b0.seq_parent_id, b0.seq_shared, b0.seq_depth) == (a0.id, len(b.turns[0].prompt), 1)
    # and: each later turn is a delta against the previous step (its whole sequence is shared)
    for r in (a, b):
        for k in (1, 2):
            prev, step = steps[(door.uid(r.name), k - 1)], steps[(door.uid(r.name), k)]
            assert (step.seq_parent_id, step.seq_shared) == (prev.id, prev.seq_len)
            assert step.seq_depth == prev.seq_depth + 1
            assert bytes(step.seq_delta) == _le_int32(
                r.turns[k].prompt[prev.seq_len :] + r.turns[k].choices[0].response
            )


def _le_int32(ids: list[int]) -> bytes:
    return b"".join(i.to_bytes(4, "little") for i in ids)


@pytest.mark.parametrize("door_name", list(DOORS))
def test_group_completes_when_its_rollouts_ended_and_enqueues_one_merge_on_commit(
    door_of, door_name, django_capture_on_commit_callbacks, enqueued
):
    # given: a group expecting two rollouts
    a, b = scenario("group")
    door = door_of(door_name)
    with django_capture_on_commit_callbacks(execute=True):
        resp = door.client.post(
            "/api/v1/groups", {"uid": door.uid("g"), "expected_rollouts": 2}, format="json"
        )
    assert resp.status_code == 200, resp.content

    # when: the first rollout ends
    door.write(a)

    # then: the group is still open and nothing was enqueued
    group = PromptGroup.objects.get(uid=door.uid("g"))
    assert (group.status, enqueued) == (PromptGroup.Status.OPEN, [])

    # when: the second ends
    door.write(b)

    # then: the group is complete and its merge was enqueued once, on commit
    group.refresh_from_db()
    assert group.status == PromptGroup.Status.COMPLETE and group.completed_at is not None
    assert enqueued == [(([group.id],), {})]


@pytest.mark.parametrize("door_name", WHITE_BOX)
def test_a_resubmission_writes_nothing_and_changed_content_is_a_conflict(door_of, door_name):
    # given: a stored rollout
    [a, _] = scenario("group")
    door = door_of(door_name)
    assert isinstance(door, WhiteBoxDoor)
    door.write(a)
    before = snapshot(door, [a])
    steps = door.steps(a, range(3), end=True)

    # when: the same batch is submitted again
    again = door.post(steps)

    # then: it is accepted as duplicates and not a single column changed
    assert again.status_code == 200, again.content
    assert snapshot(door, [a]) == before

    # when: a step comes again under its uid with a different response
    steps[2] = dict(steps[2], response_ids=[*steps[2]["response_ids"][:-1], 1])
    conflict = door.post(steps)

    # then: 409, and still nothing changed
    assert conflict.status_code == 409, conflict.content
    assert conflict.json()["error"]["code"] == "conflict"
    assert snapshot(door, [a]) == before


@pytest.mark.parametrize("door_name", WHITE_BOX)
def test_a_batch_with_a_step_that_cannot_be_stored_writes_nothing(door_of, door_name):
    # given: an ended rollout
    [a, _] = scenario("group")
    door = door_of(door_name)
    assert isinstance(door, WhiteBoxDoor)
    door.write(a)
    before = pool_counts()

    # when: a batch creates a new trajectory, group and policy version, then adds a step past
    # the end of the ended one (refused only once the new rows are inserted)
    new = rollout(
        "n", group="h", prompt=group_prompt(9), turns=1, reward=1.0, versions=next(_versions), seed=9
    )
    late = dict(door.steps(a, [2], end=False)[0], uid=f"{door.uid('a')}:3", step_index=3)
    resp = door.post([*door.steps(new, [0], end=False), late])

    # then: 409 naming the late step, and no row of any table was written
    assert resp.status_code == 409, resp.content
    assert resp.json()["error"]["param"] == "steps[1].step_index"
    assert pool_counts() == before
    assert not Trajectory.objects.filter(uid=door.uid("n")).exists()


@pytest.mark.parametrize("door_name", PROXIED)
def test_a_proxied_call_over_the_token_limit_writes_no_step(door_of, door_name, settings):
    # given: a limit between the first turn (46 tokens) and the second (58)
    settings.CLAW_MAX_TOKENS_PER_STEP = 50
    [a] = scenario("solo")
    door = door_of(door_name)
    assert isinstance(door, ProxyDoor)
    door.write_turns(a, [0], end=False)
    before = pool_counts()

    # when: the second call is over the limit
    outcome = door.call(a, 1)

    # then: no step, no index taken; the call is kept as an event naming the field
    assert (outcome.steps, outcome.event) == ([], "unrecorded_call")
    event = Event.objects.get(type="unrecorded_call", trajectory__uid=door.uid("s"))
    assert event.payload["field"] == "choices[0].prompt_ids"
    assert pool_counts() == {**before, "Event": before["Event"] + 1}
    assert Trajectory.objects.get(uid=door.uid("s")).step_count == 1

    # and: the same call under a higher limit takes the next index
    settings.CLAW_MAX_TOKENS_PER_STEP = 100
    assert [s.step_index for s in door.call(a, 1).steps] == [1]


@pytest.mark.parametrize("door_name", PROXIED)
def test_a_first_proxied_call_over_the_token_limit_creates_no_trajectory(door_of, door_name, settings):
    # given: a limit below the first turn (46 tokens)
    settings.CLAW_MAX_TOKENS_PER_STEP = 45
    [s] = scenario("solo")
    door = door_of(door_name)
    assert isinstance(door, ProxyDoor)
    before = pool_counts()

    # when: the call is recorded
    outcome = door.call(s, 0)

    # then: only the event is stored
    assert outcome.event == "unrecorded_call"
    assert pool_counts() == {**before, "Event": before["Event"] + 1}
    assert not Trajectory.objects.filter(uid=door.uid("s")).exists()


# --- 3. rejections naming the field, on every door that accepts it --------------------------------
LONG = "x" * 129  # trajectory and group uids are at most 128 characters
LONG_STEP_UID = "x" * 161  # step uids at most 160 (their column)

# (id, door, change to the second step of [good, bad], CLAW_MAX_TOKENS_PER_STEP, expected param)
STEP_REJECTIONS: list[tuple[str, str, dict[str, Any], int | None, str]] = [
    *[
        ("tokens", d, {"prompt_ids": [1, 2, 3, 4, 5, 6], "response_ids": [7, 8, 9]}, 8, "steps[1].prompt_ids")
        for d in WHITE_BOX
    ],
    *[("reward-nan", d, {"reward": float("nan")}, None, "steps[1].reward") for d in ("json", "msgpack")],
    *[("reward-inf", d, {"reward": float("inf")}, None, "steps[1].reward") for d in ("json", "msgpack")],
    *[("uid", d, {"uid": LONG_STEP_UID}, None, "steps[1].uid") for d in ("json", "msgpack")],
    *[("trajectory_uid", d, {"trajectory_uid": LONG}, None, "steps[1].trajectory_uid") for d in WHITE_BOX],
    *[
        ("prompt_group_uid", d, {"prompt_group_uid": LONG}, None, "steps[1].prompt_group_uid")
        for d in ("json", "msgpack")
    ],
    # Claw-R1's errors name its own fields (prompt_uid, not prompt_group_uid); its non-finite
    # reward has a test of its own below (NaN cannot cross msgpack/JSON the same way).
    ("prompt_uid", "claw_r1", {"prompt_group_uid": LONG}, None, "steps[1].prompt_uid"),  # sent as prompt_uid
]


@pytest.mark.parametrize(
    ("door_name", "change", "max_tokens", "param"),
    [pytest.param(*case[1:], id=f"{case[1]}-{case[0]}") for case in STEP_REJECTIONS],
)
def test_a_bad_step_is_rejected_naming_the_field_and_nothing_is_written(
    door_of, settings, door_name, change, max_tokens, param
):
    # given: a valid step (new trajectory, group, policy version; 8 tokens) and a bad one
    if max_tokens is not None:
        settings.CLAW_MAX_TOKENS_PER_STEP = max_tokens
    door = door_of(door_name)
    assert isinstance(door, WhiteBoxDoor)
    good = _small_step(door, "good", [1, 2, 3, 4, 5, 6], [7, 8])
    bad = dict(_small_step(door, "bad", [11, 12, 13], [14, 15]), **change)
    before = pool_counts()

    # when: they are submitted in one batch
    resp = door.post([good, bad])

    # then: 400 naming the field, and nothing was written
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == param
    assert pool_counts() == before


def _small_step(door: Door, name: str, prompt: list[int], response: list[int]) -> dict[str, Any]:
    return {
        "uid": f"{door.uid(name)}:0",
        "trajectory_uid": door.uid(name),
        "prompt_group_uid": door.uid(f"{name}-g"),
        "step_index": 0,
        "prompt_ids": prompt,
        "response_ids": response,
        "policy_version": next(_versions),
    }


def test_claw_r1_submit_steps_rejects_a_bad_channel_naming_it(door_of):
    # given: a valid batch
    door = door_of("claw_r1")
    assert isinstance(door, WhiteBoxDoor)
    before = pool_counts()

    # when: it names a channel that does not exist
    resp = door.post([_small_step(door, "good", [1, 2, 3], [4])], channel="test")

    # then: 400 naming the channel, nothing written
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == "channel"
    assert pool_counts() == before


def test_claw_r1_non_finite_reward_is_rejected_and_nothing_is_written(door_of):
    # given: a valid step and one with a NaN reward, as Python's json module writes it
    door = door_of("claw_r1")
    assert isinstance(door, WhiteBoxDoor)
    steps = [
        _small_step(door, "good", [1, 2, 3], [4]),
        dict(_small_step(door, "bad", [5, 6], [7]), reward=float("nan")),
    ]
    before = pool_counts()

    # when: submitted
    resp = door.post(steps)

    # then: 400 naming the field, and nothing written
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == "steps[1].reward"
    assert pool_counts() == before


def _gateway_post(path: str, key: str, body: Any = None, headers: dict[str, str] | None = None):
    return Client().post(
        path,
        data=body if isinstance(body, bytes) else json.dumps(body or {}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}", **(headers or {})},
    )


CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("path", "headers", "name"),
    [
        pytest.param("/v1/chat/completions", {"X-Claw-Trajectory": LONG}, "trajectory", id="header"),
        pytest.param(
            "/v1/chat/completions", {"X-Claw-Prompt-Group": LONG}, "prompt group", id="group-header"
        ),
        pytest.param(f"/t/{LONG}/-/v1/chat/completions", {}, "trajectory", id="scoped-url"),
        pytest.param(f"/compat/claw-r1/{LONG}/g/v1/chat/completions", {}, "trajectory", id="claw-r1-url"),
    ],
)
def test_a_proxied_call_with_a_uid_over_128_characters_is_rejected(agent_key, path, headers, name):
    # given: an empty pool
    before = pool_counts()

    # when: a call names a uid of 129 characters (in its URL or a header)
    resp = _gateway_post(path, agent_key, CHAT_BODY, headers)

    # then: 400 before anything is forwarded or written. The uid is not a body parameter, so
    # OpenAI's "param" stays null and the message names it.
    assert resp.status_code == 400, resp.content
    error = resp.json()["error"]
    assert error["code"] == "invalid_uid" and f"{name} uid" in error["message"]
    assert pool_counts() == before


def test_claw_r1_init_rejects_a_prompt_uid_over_128_characters_naming_it(agent_key):
    before = pool_counts()
    resp = _gateway_post("/compat/claw-r1/init_trajectory", agent_key, {"prompt_uid": LONG})
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == "prompt_uid"
    assert pool_counts() == before


def test_claw_r1_register_rejects_a_trajectory_uid_over_128_characters(agent_key):
    before = pool_counts()
    resp = _gateway_post(f"/compat/claw-r1/{LONG}/g/v1/register_trajectory", agent_key, {})
    assert resp.status_code == 400, resp.content
    assert pool_counts() == before


@pytest.mark.parametrize("endpoint", ["register_trajectory", "complete_trajectory"])
def test_claw_r1_trajectory_endpoints_reject_a_bad_channel_naming_it(door_of, endpoint):
    # given: a running proxied trajectory
    [s] = scenario("solo")
    door = door_of("proxy_fast")
    door.write_turns(s, [0], end=False)
    before = snapshot(door, [s])

    # when: an endpoint of its base URL is given a channel that does not exist
    resp = _gateway_post(f"/compat/claw-r1/{door.uid('s')}/-/v1/{endpoint}", door.key, {"channel": "test"})

    # then: 400 naming the channel; the trajectory is unchanged (still running, channel train)
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == "channel"
    assert snapshot(door, [s]) == before


def test_claw_r1_complete_rejects_a_non_finite_reward_and_changes_nothing(door_of):
    # given: a running proxied trajectory
    [s] = scenario("solo")
    door = door_of("proxy_fast")
    door.write_turns(s, [0], end=False)
    before = snapshot(door, [s])

    # when: it is completed with a NaN reward (as Python's json module writes it)
    resp = _gateway_post(
        f"/compat/claw-r1/{door.uid('s')}/-/v1/complete_trajectory", door.key, b'{"reward": NaN}'
    )

    # then: 400 naming the field, and nothing changed
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == "reward"
    assert snapshot(door, [s]) == before


# --- 4. what a write costs ------------------------------------------------------------------------
# Statements per white-box batch of one group's rollouts, 5 turns each (observed):
#   SQLite 17: key lookup, uid check, group select/insert/select, trajectory select + insert,
#     policy version select, 6 step INSERTs (one per in-batch parent level: the anchor, then
#     one per turn), trajectory counters UPDATE, anchor UPDATE, group-complete check. (The
#     batch creates and ends its trajectories: their rows carry their readiness bits, so
#     readiness costs no statement.)
#   PostgreSQL 23: the same with nextval + COPY per level instead of an INSERT.
# These rollouts carry their reward on the last step only (Claw-R1's shape), so each
# trajectory takes it as its own (effects._outcome_rewards): SQLite +6, PostgreSQL +7 (the
# last steps' read, the trajectory locks and update, the audit rows, readiness settled),
# and +2 for the earlier steps' effective reward, the branch's outcome
# (pool/services/effective_reward.py: one read of the steps' reward columns, one UPDATE).
# Independent of the number of rollouts; one more level (two statements on PostgreSQL) per
# extra turn of one trajectory inside the same batch. The Claw-R1 door adds one SELECT: the
# upstream texts remembered from its /generate for the batch's response ids.
WHITE_BOX_BATCH_MAX = {"sqlite": 25, "postgresql": 32}
DOOR_EXTRA = {"claw_r1": 1}


@pytest.mark.parametrize("door_name", WHITE_BOX)
def test_a_white_box_batch_costs_the_same_statements_for_10_and_50_steps(door_of, door_name):
    # given: batches of 2 and of 10 five-turn rollouts of one group, and a warm process (the
    # first batch of a process reads table metadata once; the policy version exists)
    version = next(_versions)
    prompt = group_prompt()

    def batch(door: WhiteBoxDoor, n_rollouts: int) -> list[dict[str, Any]]:
        rs = [
            rollout(f"r{i}", group="g", prompt=prompt, turns=5, reward=1.0, versions=version, seed=i)
            for i in range(n_rollouts)
        ]
        return [step for r in rs for step in door.steps(r, range(5), end=True)]

    warm = door_of(door_name)
    assert isinstance(warm, WhiteBoxDoor)
    assert warm.post(batch(warm, 1)).status_code in (200, 201)  # Claw-R1 answers 200
    counts = {}
    for n_steps in (10, 50):
        door = door_of(door_name)
        assert isinstance(door, WhiteBoxDoor)
        steps = batch(door, n_steps // 5)

        # when: the batch is submitted
        with sql_statements() as statements:
            resp = door.post(steps)
        assert resp.status_code in (200, 201), resp.content
        counts[n_steps] = len(statements)

    # then: both cost the same number of statements, within the observed bound
    assert (
        counts[10] == counts[50] <= WHITE_BOX_BATCH_MAX[connection.vendor] + DOOR_EXTRA.get(door_name, 0)
    ), counts


# Statements per proxied call on the fast path (observed): PostgreSQL 1 (claim or create the
# trajectory and insert the steps in one CTE); SQLite 2 (INSERT or claiming UPDATE of the
# trajectory, INSERT of the steps).
FAST_CALL = {"sqlite": 2, "postgresql": 1}


def test_a_proxied_call_on_the_fast_path_is_one_statement_on_postgresql(door_of):
    # given: a trajectory the gateway mints (no group, no policy version)
    [s] = scenario("solo")
    door = door_of("proxy_fast")

    # when: its first call, then two more, are recorded (in a warm process)
    seen = _statements_of_calls(door, s, 3)

    # then: every call costs the fast path's statements
    counts = [len(statements) for statements in seen]
    assert counts == [FAST_CALL[connection.vendor]] * 3, seen


def _statements_of_calls(door: ProxyDoor, r: Rollout, n: int) -> list[list[str]]:
    """The statements of each of the first ``n`` calls of ``r``, recorded by a warm process
    (the live events name the source, read once per process)."""
    live.source_name(door.source_id)
    seen = []
    for k in range(n):
        with sql_statements() as statements:
            door.call(r, k)
        seen.append(statements)
    return seen


# Statements per first call of a trajectory the agent named, in a group new to the pool
# (observed): PostgreSQL 2 (group, trajectory and step in one CTE; its savepoint, which
# undoes the group should the claim miss, is transaction control), then the step's anchoring
# of the group (effects.group_anchors); SQLite 6 (group lookup and insert, trajectory lookup
# and insert, the step INSERT, the anchor). The general path took 13 / 14.
NAMED_FIRST_CALL = {"sqlite": 6, "postgresql": 2}


@pytest.mark.parametrize("group", [True, False], ids=["new group", "no group"])
def test_a_named_trajectorys_first_call_is_the_fast_paths_statement(door_of, group):
    # given: a trajectory the agent names (a /t/<trajectory>/<group>/ URL), unknown to the pool,
    # without a policy version (a version new to the process takes the general path once)
    a = rollout(
        "a", group="g" if group else None, prompt=group_prompt(), turns=3, reward=1.0, versions=None, seed=1
    )
    door = door_of("proxy_named")

    # when: its first call, then two more, are recorded
    seen = _statements_of_calls(door, a, 3)

    # then: the first creates the group (if any), the trajectory and the step in the fast
    # path's one statement (and anchors the group), and the next ones are the fast path's
    counts = [len(statements) for statements in seen]
    first = (
        NAMED_FIRST_CALL[connection.vendor]
        if group
        else FAST_CALL[connection.vendor]
        + (
            connection.vendor == "sqlite"  # SQLite looks the uid up before its INSERT
        )
    )
    assert counts == [first] + [FAST_CALL[connection.vendor]] * 2, seen
    # and: they are stored in the group, the first step anchoring it
    traj = Trajectory.objects.get(uid=door.uid("a"))
    assert traj.step_count == 3
    if group:
        g = PromptGroup.objects.get(uid=door.uid("g"))
        assert (traj.group_id, g.anchor_step_id) == (g.id, Step.objects.get(trajectory=traj, step_index=0).id)
        assert g.source_id == door.source_id  # the writer's source's, as groups_ensure makes it


def test_a_groups_next_rollouts_are_stored_against_its_anchor_in_the_fast_paths_statement(door_of):
    # given: a group of three rollouts (no policy version), the first two recorded: the first
    # created the group, the second's first call read its anchor
    a, b, c = scenario("group_of_3")
    door = door_of("proxy_named")
    live.source_name(door.source_id)
    door.write_turns(a, [0], end=False)
    with sql_statements() as second:
        door.write_turns(b, [0], end=False)
    # (the second found the anchor set, so it did not try to set it)
    assert not [q for q in second if q.lstrip().upper().startswith("UPDATE") and "anchor_step_id" in q], (
        second
    )

    # when: the third rollout's first call is recorded
    with sql_statements() as statements:
        door.call(c, 0)

    # then: one statement stored it against the anchor, which it checked (so the effect that
    # anchors a group's first step has nothing to do); SQLite: the group and trajectory
    # lookups, the two INSERTs
    assert len(statements) == {"sqlite": 4, "postgresql": 1}[connection.vendor], statements
    steps = {s.trajectory.uid: s for s in Step.objects.filter(step_index=0).select_related("trajectory")}
    a0, c0 = steps[door.uid("a")], steps[door.uid("c")]
    assert PromptGroup.objects.get(uid=door.uid("g")).anchor_step_id == a0.id
    assert (c0.seq_parent_id, c0.seq_shared, c0.seq_depth) == (a0.id, len(c.turns[0].prompt), 1)
    assert stored_ids(door, c)[0] == c.turns[0].prompt + c.turns[0].choices[0].response


def test_a_stale_anchor_hint_is_not_trusted(door_of):
    # given: a group whose first rollout is stored, and a process that wrongly remembers
    # another step (of other ids) as its anchor
    from pool.ingest.claim import GroupAnchor, anchors
    from pool.ingest.plan import Stored

    a, b, _ = scenario("group_of_3")
    door = door_of("proxy_named")
    door.write_turns(a, [0], end=False)
    [decoy] = scenario("solo")
    door.write_turns(decoy, [0], end=False)
    group = PromptGroup.objects.get(uid=door.uid("g"))
    wrong = Step.objects.get(trajectory__uid=door.uid("s"), step_index=0)
    anchors.put(
        door.uid("g"),
        GroupAnchor(group.id, Stored(wrong.id, 0, np.asarray(decoy.turns[0].prompt, dtype=np.int32))),
    )

    # when: the next rollout's first call is recorded
    door.call(b, 0)

    # then: it is stored against the group's real anchor, and reads back exactly
    b0 = Step.objects.get(trajectory__uid=door.uid("b"), step_index=0)
    assert (b0.seq_parent_id, b0.seq_shared) == (group.anchor_step_id, len(b.turns[0].prompt))
    assert stored_ids(door, b)[0] == b.turns[0].prompt + b.turns[0].choices[0].response


@pytest.mark.parametrize("group", [False, True], ids=["no group", "in a group"])
def test_a_registered_trajectorys_first_call_claims_index_0_in_the_fast_paths_statement(door_of, group):
    # given: a group with its anchor (another rollout's first step), and a trajectory
    # registered through Claw-R1 (register_trajectory), in that group or in none, no step yet
    a, b, _ = scenario("group_of_3")
    door = door_of("proxy_named")
    door.write_turns(a, [0], end=False)
    r = b if group else dataclasses.replace(b, group=None)
    with door.capture(execute=True):
        resp = _gateway_post(
            f"/compat/claw-r1/{door.uid('b')}/{door.group_uid(r) or '-'}/v1/register_trajectory", door.key, {}
        )
    assert resp.status_code == 200, resp.content

    # when: its first call is recorded
    [statements] = _statements_of_calls(door, r, 1)

    # then: without a group, the fast path's statement claimed index 0; in the group, the
    # general path stored its first step against the group's anchor, as every door does
    b0 = Step.objects.get(trajectory__uid=door.uid("b"))
    assert b0.step_index == 0 and b0.trajectory.step_count == 1
    if group:
        assert len(statements) > FAST_CALL[connection.vendor] + 1, statements
        anchor = PromptGroup.objects.get(uid=door.uid("g")).anchor_step_id
        assert (b0.seq_parent_id, b0.seq_shared) == (anchor, len(b.turns[0].prompt))
    else:
        assert len(statements) == FAST_CALL[connection.vendor], statements
        assert b0.trajectory.group_id is None
    assert stored_ids(door, r)[0] == b.turns[0].prompt + b.turns[0].choices[0].response


# Statements per proxied call on the general path (observed, SQLite / PostgreSQL):
#   first call of a trajectory: 7 / 8; a later call: 9 / 10 (reserve, previous call and its
#   sequence, then steps_ingest's own uid check, neighbour lookup and sequence load, insert,
#   counters); a group's first call: 13 / 14 (policy version and group rows, anchor).
GENERAL_CALL_MAX = {"sqlite": (7, 9), "postgresql": (8, 10)}


def test_a_proxied_call_on_the_general_path_costs_a_fixed_number_of_statements(door_of):
    # given: a trajectory the gateway did not mint, recorded with no memory of earlier calls,
    # and a warm process (the first COPY of a process reads table metadata once)
    [s] = scenario("long_chain")
    door_of("proxy_general").call(s, 0)
    door = door_of("proxy_general")
    counts = []

    # when: its first five calls are recorded
    for k in range(5):
        with sql_statements() as statements:
            door.call(s, k)
        counts.append(len(statements))

    # then: the first costs its bound, every later call the same number, within its bound
    first, later = GENERAL_CALL_MAX[connection.vendor]
    assert counts[0] <= first, counts
    assert len(set(counts[1:])) == 1 and counts[1] <= later, counts
