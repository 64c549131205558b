"""POST /api/v1/task-sampler: each strategy's contract, exploration, seeds, and the records."""

from __future__ import annotations

import pytest

from pool.models import Scope, Task, TaskSampleRecord
from pool.services.task_catalog import TaskIn, tasks_register
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def make_tasks(specs: list[tuple[str, float, int]], set_name: str = "s") -> None:
    """Tasks with recent statistics: (uid, recent pass rate, seen) -> the stored columns the
    stats effect would have written for 8 rewarded rollouts per sighting."""
    tasks_register(tasks=[TaskIn(uid=u, set_name=set_name, prompt=f"prompt {u}") for u, _, _ in specs])
    for uid, rate, seen in specs:
        n = 8.0 * seen
        passes = rate * n
        p = (passes + 1) / (n + 2)
        Task.objects.filter(uid=uid).update(
            seen=seen,
            recent_rewarded=n,
            recent_passes=passes,
            recent_pass_rate=p,
            score=p * (1 - p),
            rewarded=int(n),
        )


def sample(client, **body):
    body.setdefault("tasks", {"set": "s"})
    resp = client.post("/api/v1/task-sampler", body, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def uids(answer) -> list[str]:
    return [t["uid"] for t in answer["tasks"]]


def test_informative_picks_mid_pass_rate_tasks_over_solved_and_hopeless(agent):
    # given ten solved, ten hopeless and ten half-solved tasks, each seen often
    make_tasks(
        [(f"solved{i}", 1.0, 10) for i in range(10)]
        + [(f"hopeless{i}", 0.0, 10) for i in range(10)]
        + [(f"mid{i}", 0.5, 10) for i in range(10)]
    )
    # when ten are asked for
    got = sample(agent, n=10, strategy="informative", seed=1, temperature=0)
    # then all ten are the half-solved ones, with their reason and statistics
    assert sorted(uids(got)) == sorted(f"mid{i}" for i in range(10))
    for t in got["tasks"]:
        assert t["reason"].startswith("informative: score 0.25")
        assert t["prompt"] == f"prompt {t['uid']}"
        assert t["stats"]["seen"] == 10


def test_exploration_gives_slots_to_tasks_seen_fewer_than_k_times(agent):
    # given many half-solved tasks and two that looked solved after one group
    make_tasks([(f"mid{i}", 0.5, 10) for i in range(30)] + [("once-a", 1.0, 1), ("once-b", 1.0, 1)])
    # when 16 are asked for with an eighth of the slots for exploration below 4 sightings
    got = sample(agent, n=16, strategy="informative", seed=2, explore_below=4, explore_fraction=0.125)
    # then both rarely seen tasks are in, marked as exploration, and the rest are informative
    reasons = {t["uid"]: t["reason"] for t in got["tasks"]}
    assert reasons["once-a"] == reasons["once-b"] == "explore: seen 1 < 4"
    assert len(reasons) == 16 and sum(r.startswith("informative") for r in reasons.values()) == 14
    # and without exploration they are starved
    assert {"once-a", "once-b"}.isdisjoint(
        uids(sample(agent, n=16, strategy="informative", seed=2, explore_fraction=0))
    )


def test_unseen_tasks_get_a_first_look_before_known_ones():
    # given unseen tasks (prior score 0.25) and a task known to sit at 0.6
    make_tasks([("known", 0.6, 10)])
    tasks_register(tasks=[TaskIn(uid=f"new{i}", set_name="s") for i in range(3)])
    agent = client_for(_key(Scope.INGEST))
    # when three are asked for, exploration off
    got = sample(agent, n=3, strategy="informative", seed=0, explore_fraction=0, temperature=0)
    # then the unseen ones come first
    assert sorted(uids(got)) == ["new0", "new1", "new2"]


def test_easy_to_hard_follows_the_pass_rate_as_the_policy_improves(agent):
    # given three tasks of rising difficulty under a weak policy
    make_tasks([("easy", 0.7, 10), ("medium", 0.3, 10), ("hard", 0.0, 10)])
    # then the task at the target pass rate is the easy one
    assert uids(sample(agent, n=1, strategy="easy_to_hard", seed=0, explore_fraction=0)) == ["easy"]
    # when the policy improves, every task's recent pass rate rises
    for uid, rate in (("easy", 1.0), ("medium", 0.7), ("hard", 0.3)):
        p = (rate * 80 + 1) / 82
        Task.objects.filter(uid=uid).update(recent_passes=rate * 80, recent_pass_rate=p, score=p * (1 - p))
    # then the band has moved to the harder task
    got = sample(agent, n=1, strategy="easy_to_hard", seed=0, explore_fraction=0)
    assert uids(got) == ["medium"]
    assert got["tasks"][0]["reason"] == "easy_to_hard: recent pass rate 0.70, target 0.70"
    # and a target of 0.3 picks the hard one
    assert uids(sample(agent, n=1, strategy="easy_to_hard", seed=0, explore_fraction=0, target=0.3)) == [
        "hard"
    ]


def test_least_seen_picks_the_least_seen(agent):
    make_tasks([(f"t{i}", 0.5, i) for i in range(10)])
    got = sample(agent, n=3, strategy="least_seen", seed=5)
    assert uids(got) == ["t0", "t1", "t2"]
    assert [t["reason"] for t in got["tasks"]] == [
        "least_seen: seen 0",
        "least_seen: seen 1",
        "least_seen: seen 2",
    ]


def test_uniform_is_distinct_seeded_reproducible_and_covers_the_set(agent):
    # given 100 tasks, their random keys evenly spread (so the test is deterministic)
    make_tasks([(f"u{i}", 0.5, 1) for i in range(100)])
    for i in range(100):
        Task.objects.filter(uid=f"u{i}").update(rand_key=(i + 0.5) / 100)
    # when sampled twice with one seed and once with another
    a, b, c = (uids(sample(agent, n=20, strategy="uniform", seed=s)) for s in (7, 7, 8))
    # then the same seed gives the same answer, another seed another, each without repeats
    assert a == b and a != c and len(set(a)) == 20 == len(set(c))
    # and over many seeds every task comes up
    covered = set()
    for seed in range(60):
        covered.update(uids(sample(agent, n=20, strategy="uniform", seed=seed)))
    assert len(covered) == 100
    # and asking for more than there are returns them all once
    assert sorted(uids(sample(agent, n=150, strategy="uniform", seed=1))) == sorted(
        f"u{i}" for i in range(100)
    )


def test_filters_narrow_the_candidates(agent):
    make_tasks([("a", 0.5, 3)], set_name="one")
    make_tasks([("b", 0.5, 3), ("c", 1.0, 9)], set_name="two")
    assert uids(sample(agent, n=5, strategy="uniform", seed=0, tasks={"set": "one"})) == ["a"]
    got = sample(agent, n=5, strategy="least_seen", seed=0, tasks={"set": "two", "seen_min": 5})
    assert uids(got) == ["c"]


def test_every_answer_is_recorded_and_readable(agent_key, reader):
    # given an agent that samples twice
    agent = client_for(agent_key)
    make_tasks([(f"r{i}", 0.5, 5) for i in range(5)])
    first = sample(agent, n=2, strategy="informative", seed=11)
    second = sample(agent, n=3, strategy="uniform")  # no seed: one is chosen and recorded
    # then each is a record with who asked, the parameters and the tasks with reasons
    rows = reader.get("/api/v1/task-sampler/records").json()["results"]
    assert [r["id"] for r in rows] == [first["record"], second["record"]]
    for row, answer, strategy in ((rows[0], first, "informative"), (rows[1], second, "uniform")):
        assert row["strategy"] == strategy
        assert row["tasks"] == [{"uid": t["uid"], "reason": t["reason"]} for t in answer["tasks"]]
        assert row["params"]["seed"] == answer["seed"]
        assert row["params"]["tasks"] == {"set": "s"}
    record = TaskSampleRecord.objects.get(id=first["record"])
    assert record.api_key.name == "agent" and record.source.name == "agent"
    assert rows[0]["params"]["n"] == 2 and rows[0]["params"]["explore_below"] == 4
    # and replaying the recorded seed reproduces the uniform answer
    assert uids(sample(agent, n=3, strategy="uniform", seed=second["seed"])) == uids(second)


BAD = [
    ({"n": 4, "strategy": "best"}, "strategy"),
    ({"n": 0, "strategy": "uniform"}, "n"),
    ({"n": 4}, "strategy"),
    ({"n": 4, "strategy": "uniform", "tasks": {"colour": "red"}}, "tasks.colour"),
    ({"n": 4, "strategy": "uniform", "tasks": {"pass_rate_min": "x"}}, "tasks.pass_rate_min"),
    ({"n": 4, "strategy": "informative", "explore_fraction": 2}, "explore_fraction"),
    ({"n": 4, "strategy": "easy_to_hard", "target": -1}, "target"),
    ({"n": 4, "strategy": "uniform", "seed": "x"}, "seed"),
]


@pytest.mark.parametrize(("body", "field"), BAD, ids=[b[1] for b in BAD])
def test_bad_requests_are_400s_naming_the_field_and_record_nothing(agent, body, field):
    resp = agent.post("/api/v1/task-sampler", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == field
    assert TaskSampleRecord.objects.count() == 0


def test_scopes_and_tenancy(make_key):
    # given tasks of two sources
    a, b = client_for(make_key(Scope.INGEST, name="a")), client_for(make_key(Scope.INGEST, name="b"))
    a.post("/api/v1/tasks", {"tasks": [{"uid": "mine-a", "set": "s"}]}, format="json")
    b.post("/api/v1/tasks", {"tasks": [{"uid": "mine-b", "set": "s"}]}, format="json")
    # then each source samples its own only; no key is 401, a policy-only key 403
    assert uids(sample(a, n=5, strategy="uniform", seed=0)) == ["mine-a"]
    assert uids(sample(b, n=5, strategy="uniform", seed=0)) == ["mine-b"]
    assert (
        client_for(None)
        .post("/api/v1/task-sampler", {"n": 1, "strategy": "uniform"}, format="json")
        .status_code
        == 401
    )
    policy = client_for(make_key(Scope.POLICY, name="p"))
    assert (
        policy.post("/api/v1/task-sampler", {"n": 1, "strategy": "uniform"}, format="json").status_code == 403
    )
    # and a read key (it reads every source) samples among every source's tasks
    reader = client_for(make_key(Scope.READ, name="r"))
    assert sorted(uids(sample(reader, n=5, strategy="uniform", seed=0))) == ["mine-a", "mine-b"]
    # and a trainer's consume key may sample
    trainer = client_for(make_key(Scope.CONSUME, name="t"))
    assert sample(trainer, n=5, strategy="uniform", seed=0)["tasks"] == []


def _key(*scopes: str) -> str:
    from pool.services.api_keys import api_key_create

    return api_key_create(name="k", scopes=list(scopes))[1]
