"""The tenancy matrix: every REST endpoint that writes or reads a source's data, against
every kind of actor (pool/tenancy.py).

Source A's agent ("own") has a trajectory of two steps in its own prompt group, with
feedback and an event. Another source's ingest key ("other") may neither write nor read
any of it: reads answer 404 as for an unknown uid, writes naming A's uids answer 409
``uid_taken`` (creating) or 404 (targeting), and A's rows stay exactly as they were. A read
key reads everything and writes nothing (403); an admin key does both.
"""

from __future__ import annotations

import pytest

from pool.models import Event, Feedback, PromptGroup, RewardEvent, Scope, Step, Trajectory
from pool.services import api_key_create
from tests.conftest import client_for, make_step, post_steps

pytestmark = pytest.mark.django_db

T, G = "a-t", "a-g"
S0 = f"{T}-s0"
SEED = [
    make_step(T, 0, group=G, prompt=[1, 2, 3], response=[4]),
    make_step(T, 1, group=G, prompt=[1, 2, 3, 4, 5], response=[6]),
]
ACTORS = {"own": [Scope.INGEST], "other": [Scope.INGEST], "read": [Scope.READ], "admin": [Scope.ADMIN]}

# (name, path, body, {actor: status}); an error status names its code.
OK, TAKEN, GONE, DENIED = 200, (409, "uid_taken"), (404, "not_found"), (403, "permission_denied")
WRITES = [
    (
        "step into A's trajectory",
        "steps",
        {"steps": [make_step(T, 2, group=G)]},
        {"own": 201, "admin": 201},
        TAKEN,
    ),
    ("A's step resubmitted", "steps", {"steps": [SEED[0]]}, {"own": OK, "admin": OK}, TAKEN),
    (
        "new trajectory in A's group",
        "steps",
        {"steps": [make_step("b-t", 0, group=G)]},
        {"own": 201, "admin": 201},
        TAKEN,
    ),
    ("trajectory create", "trajectories", {"uid": T}, {"own": OK, "admin": OK}, TAKEN),
    ("trajectory complete", f"trajectories/{T}/complete", {"reward": -5.0}, {"own": OK, "admin": OK}, GONE),
    (
        "completions",
        "trajectory-completions",
        {"completions": [{"uid": T, "reward": -5.0}]},
        {"own": OK, "admin": OK},
        GONE,
    ),
    ("step reward", "rewards", {"step_uid": S0, "reward": -5.0}, {"own": OK, "admin": OK}, GONE),
    ("trajectory reward", "rewards", {"trajectory_uid": T, "reward": -5.0}, {"own": OK, "admin": OK}, GONE),
    ("step feedback", "feedback", {"step_uid": S0, "rating": -1.0}, {"own": 201, "admin": 201}, GONE),
    (
        "trajectory feedback",
        "feedback",
        {"trajectory_uid": T, "rating": -1.0},
        {"own": 201, "admin": 201},
        GONE,
    ),
    ("event on A's step", "events", {"type": "x", "step_uid": S0}, {"own": 201, "admin": 201}, GONE),
    (
        "event on A's trajectory",
        "events",
        {"type": "x", "trajectory_uid": T},
        {"own": 201, "admin": 201},
        GONE,
    ),
    ("group upsert", "groups", {"uid": G, "expected_rollouts": 9}, {"own": OK, "admin": OK}, TAKEN),
]
# (path, what an allowed reader gets: a status or the count of listed results)
READS = [
    (f"steps/{S0}", OK),
    (f"trajectories/{T}", OK),
    (f"groups/{G}", OK),
    (f"groups/{G}/prefix-tree", OK),
    (f"steps?trajectory_uid={T}", 2),
    ("trajectories", 1),
    ("groups", 1),
    ("events", 1),
    ("feedback", 1),
]


@pytest.fixture
def world():
    """A's data (written by A's key) and a client per actor."""
    clients = {
        name: client_for(api_key_create(name=f"tenant-{name}", scopes=scopes)[1])
        for name, scopes in ACTORS.items()
    }
    own = clients["own"]
    assert post_steps(own, SEED).status_code == 201
    assert own.post("/api/v1/feedback", {"step_uid": S0, "label": "seed"}, format="json").status_code == 201
    assert own.post("/api/v1/events", {"type": "seed", "trajectory_uid": T}, format="json").status_code == 201
    return clients


def state_of_a() -> dict:
    """Every stored field of A's rows, and what points at them."""
    return {
        "trajectory": list(Trajectory.objects.filter(uid=T).values()),
        "steps": list(Step.objects.filter(trajectory__uid=T).order_by("step_index").values()),
        "group": list(PromptGroup.objects.filter(uid=G).values()),
        "trajectories_in_group": list(Trajectory.objects.filter(group__uid=G).values_list("uid", flat=True)),
        "reward_events": list(RewardEvent.objects.values()),
        "feedback": list(Feedback.objects.values()),
        "events": list(Event.objects.values()),
    }


def expected_status(expect: dict, denied: tuple, actor: str) -> tuple[int, str | None]:
    if actor == "read":
        return DENIED
    if actor in expect:
        return expect[actor], None
    return denied


@pytest.mark.parametrize("actor", list(ACTORS))
@pytest.mark.parametrize(("name", "path", "body", "expect", "denied"), WRITES, ids=[w[0] for w in WRITES])
def test_write_matrix(world, actor, name, path, body, expect, denied):
    # given A's data
    before = state_of_a()
    # when an actor writes to it
    resp = world[actor].post(f"/api/v1/{path}", body, format="json")
    # then only A and admins may; a refused write changes nothing of A's, field by field
    status, code = expected_status(expect, denied, actor)
    assert resp.status_code == status, resp.content
    if code is not None:
        assert resp.json()["error"]["code"] == code
        assert state_of_a() == before
    if code == "uid_taken":  # says nothing more than that the uid is taken
        assert "is taken" in resp.json()["error"]["message"]
        assert "step_index" not in resp.json()["error"]["message"]


@pytest.mark.parametrize("actor", list(ACTORS))
@pytest.mark.parametrize(("path", "allowed"), READS, ids=[r[0] for r in READS])
def test_read_matrix(world, actor, path, allowed):
    # when an actor reads A's data
    resp = world[actor].get(f"/api/v1/{path}")
    # then A, read keys and admins see it; another source sees an unknown uid or nothing
    sees = actor != "other"
    if allowed == OK:
        assert resp.status_code == (OK if sees else 404), resp.content
        if not sees:  # exactly as for a uid that does not exist
            unknown = world["own"].get(
                f"/api/v1/{path.replace(T, 'nope').replace(G, 'nope').replace(S0, 'nope')}"
            )
            assert resp.status_code == unknown.status_code
            assert resp.json()["error"]["code"] == unknown.json()["error"]["code"]
    else:
        assert resp.status_code == OK, resp.content
        assert len(resp.json()["results"]) == (allowed if sees else 0)


def test_a_key_granted_another_source_writes_and_reads_it_as_its_own(world):
    # given a key of source B granted source A (an admin's choice)
    _, clear = api_key_create(
        name="b-granted", source_name="tenant-other", scopes=[Scope.INGEST], extra_sources=["tenant-own"]
    )
    granted = client_for(clear)
    # when it rewards A's step and reads it
    assert granted.post("/api/v1/rewards", {"step_uid": S0, "reward": 0.5}, format="json").status_code == 200
    # then it did, like A
    assert granted.get(f"/api/v1/steps/{S0}").json()["reward"] == 0.5


def test_a_shared_group_takes_every_sources_trajectories(world):
    # given a group an admin created (shared: no source)
    assert world["admin"].post("/api/v1/groups", {"uid": "shared-g"}, format="json").status_code == 200
    # when A and B write rollouts into it
    for actor in ("own", "other"):
        assert post_steps(world[actor], [make_step(f"{actor}-r", 0, group="shared-g")]).status_code == 201
    # then both are its rollouts; neither may change the group itself
    assert sorted(Trajectory.objects.filter(group__uid="shared-g").values_list("uid", flat=True)) == [
        "other-r",
        "own-r",
    ]
    for actor in ("own", "other"):
        r = world[actor].post("/api/v1/groups", {"uid": "shared-g", "expected_rollouts": 1}, format="json")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "uid_taken")
    assert PromptGroup.objects.get(uid="shared-g").expected_rollouts is None
