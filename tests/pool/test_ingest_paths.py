"""Every ingest promise on every door: white-box JSON and MessagePack batches, Claw-R1's
submit_steps, and proxied calls on the fast and the general path (tests/pool/ingest_doors.py).

The doors must store the same rows for the same logical trajectory: the white-box JSON
door's rows are the reference, and every other door's rows are compared with them column by
column (all concrete fields of Step, Trajectory, PromptGroup and PolicyVersion), except the
short list of columns in EXEMPT that legitimately differ, each with its reason. The token
columns (seq_parent, seq_shared, seq_delta, seq_len, prompt_len, seq_depth, seq_hash,
rollout_logprobs) are never exempt: that is the prefix-dedup promise.

A test marked xfail(strict=True) is a difference between doors found in the current code;
the one ingest pipeline is to remove it (and the mark).
"""

from __future__ import annotations

import itertools

import pytest
from asgiref.sync import sync_to_async
from django.db import transaction

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
    "proxy_general": _PROXIED_EXEMPT,
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


_CHOICES = (
    "the fast path encodes a call's steps against the previous call's steps only (the best prefix "
    "among its n choices), steps_ingest against step_index - 1: the n choices of one call and the "
    "step after them get other seq_parent/seq_shared/seq_delta/seq_depth"
)
_POLICY = (
    "a proxied call naming a newer policy version than its trajectory's is stored with the "
    "trajectory's version: the general path (taken by the first call naming an unseen version) "
    "prefers the trajectory's, the fast path the call's"
)
ROW_XFAIL = {
    ("choices", "proxy_fast"): _CHOICES,
    ("policy_bump", "proxy_fast"): _POLICY,
    ("policy_bump", "proxy_general"): _POLICY,
}
# Reads rebuild the same ids whatever the parent; the policy version is read back as stored.
READ_XFAIL = {("policy_bump", "proxy_fast"): _POLICY, ("policy_bump", "proxy_general"): _POLICY}


def cases(xfail: dict[tuple[str, str], str]) -> list:
    return [
        pytest.param(
            s,
            d,
            id=f"{s}-{d}",
            marks=[pytest.mark.xfail(strict=True, reason=xfail[(s, d)])] if (s, d) in xfail else [],
        )
        for s in ("group", "solo", "choices", "policy_bump", "long_chain")
        for d in DOORS
    ]


# --- fixtures ---------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def enqueued(monkeypatch) -> list[tuple]:
    """Records pool.tasks.group_merge publications (the broker boundary) instead of sending."""
    calls: list[tuple] = []
    monkeypatch.setattr(
        "pool.tasks.group_merge.apply_async",
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
@pytest.mark.parametrize(("scenario_name", "door_name"), cases(ROW_XFAIL))
def test_every_door_stores_the_rows_the_json_door_stores(door_of, scenario_name, door_name):
    # given: the logical trajectories and the rows the white-box JSON door stores for them
    rollouts = scenario(scenario_name)
    expected, _ = reference(door_of, rollouts)

    # when: they go through the door under test
    door = door_of(door_name)
    for r in rollouts:
        door.write(r)

    # then: every column matches, but for the exempt ones
    exempt = EXEMPT_ALWAYS.keys() | EXEMPT[door_name].keys()
    assert differences(expected, snapshot(door, rollouts), exempt) == []


@pytest.mark.parametrize(("scenario_name", "door_name"), cases(READ_XFAIL))
def test_every_door_reads_back_exactly_what_was_written(door_of, scenario_name, door_name):
    # given: the logical trajectories and what the JSON door's steps read back as
    rollouts = scenario(scenario_name)
    _, expected = reference(door_of, rollouts)

    # when: they go through the door under test and are read back
    door = door_of(door_name)
    for r in rollouts:
        door.write(r)
    got = read_back(door, rollouts)

    # then: the token ids rebuilt from the stored deltas are exactly the written ones
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
        key: {k: v for k, v in body.items() if k not in exempt} for key, body in expected.items()
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
    assert enqueued == [((group.id,), {})]


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
    assert event.payload["field"] == "choices[0]"
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
