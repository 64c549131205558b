"""bench.curriculum: W-tasks (shared/WORKLOADS.md), the task sampler against uniform sampling.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.curriculum [--groups 20000]

PostgreSQL only: a fresh database (claw_bench_curriculum_<hex>) is created, migrated and
dropped. Everything goes through the real HTTP API in process (Django's test Client, the
whole stack, an ingest key), as bench.pull does:

* 2,000 tasks registered by ``POST /api/v1/tasks``; task i has a hidden difficulty d_i drawn
  from Beta(0.5, 0.5) by the seeded rng;
* rounds of 64 groups: ``POST /api/v1/task-sampler`` (n = 64), one ``POST /api/v1/groups``
  per group naming its task (8 expected rollouts), one ``POST /api/v1/steps`` of the 512
  white-box steps (64 prompt + 16 response tokens each, the policy version of the round,
  each with its final reward: 1 when the rollout succeeds, with probability
  clip(1 - d_i + 0.0002 v, 0, 1), else 0), then readiness: the round's 64 groups must be
  ready (and so counted into their tasks' statistics) before the next sampler call. The
  policy version rises by 1 per round;
* once with ``uniform`` and once with ``informative``, on the same seed (same difficulties,
  same rollout rng); ``informative_over_uniform`` = the fraction of groups whose 8 rewards
  are not all equal under ``informative`` over that under ``uniform`` (target >= 1.4).

Then the sampler's latency alone: 10,000 and 100,000 registered tasks of a set with random
statistics, ``informative`` and n = 64, p50 over ``--calls`` calls each (target <= 50 ms) and
their ratio (target <= 1.5). ``pull_oldest_p50_ms``: one pull of 8 groups (64 steps) and its
ack through ``POST /api/v1/consumers/{name}/pull`` (today's order, oldest ready first) of the
groups the runs made ready (40,000 at the default size; target <= 50 ms), and
``pull_priority_p50_ms`` the same pull from a dataset served by priority (``reward_std``: the
groups whose rewards spread the most first), the two taking turns. The same pulls run once
before, by consumers of their own, when a tenth of the groups are ready (4,000: at least
enough for the pulls), so ``pull_oldest_ratio`` = ``pull_oldest_p50_ms`` over
``pull_oldest_p50_ms_small`` says whether a pull's cost grows with the ready set (target <=
1.5); ``pull_ready_groups`` and ``pull_ready_groups_small`` name the two sizes. Before each
size's pulls the database is ANALYZEd (the statistics autovacuum keeps on a live server;
this server runs with it off).

Then a trainer months in: two consumers each take nine tenths of the ready groups oldest
first (pulls of up to 1,024 groups, acked), the database is ANALYZEd, then they time the
same 8-group pull and ack, taking turns: one with its pull cursor
(curation/services/cursors.py), one whose cursor never leaves the queue's head (its lag set past the oldest group: the pull of before the cursors, which
re-reads every group it took). ``pull_consumed_p50_ms`` and ``pull_consumed_head_p50_ms``
are theirs, ``pull_consumed_ratio`` the first over ``pull_oldest_p50_ms`` (a fresh consumer
at the same size; target <= 1.5: a pull does not cost more for what was taken before it) and
``pull_consumed_cursor_over_head`` the first over the second. Prints progress on stderr and
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

from bench.pgdb import fresh_database

N_TASKS, GROUP, PER_CALL = 2_000, 8, 64
PROMPT, RESPONSE = 64, 16
PULL_GROUPS = 8  # groups per pull (64 steps)
TARGETS = {
    "informative_over_uniform": 1.4,
    "sampler_p50_ms": 50.0,
    "sampler_ratio": 1.5,
    "pull_oldest_p50_ms": 50.0,
    "pull_oldest_ratio": 1.5,
    "pull_consumed_ratio": 1.5,
}
CONSUMED_SHARE = 0.9  # of the ready groups, taken before the consumed pulls are timed
TAKE_BATCH = 1024  # groups per pull while taking them


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--groups", type=int, default=20_000, help="groups per strategy (W-tasks: 20,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calls", type=int, default=40, help="timed sampler calls per size")
    p.add_argument("--skip-latency", action="store_true", help="only the curriculum runs")
    args = p.parse_args(argv)
    with fresh_database("curriculum"):
        result = run(args)
    print(json.dumps(result), flush=True)


def run(args: argparse.Namespace) -> dict:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from django.test import Client

    from pool.models import Scope
    from pool.services.api_keys import api_key_create

    key = api_key_create(name="bench-driver", scopes=[Scope.INGEST])[1]
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    result: dict = {"workload": "W-tasks", "db": "postgresql", "groups": args.groups, "seed": args.seed}
    signal = {}
    # The pulls at a tenth of the ready groups (at least enough for them), during the first run.
    small = max(2 * args.groups // 10, PULL_GROUPS * (args.calls + 2))
    small_pulls: dict[str, float] = {}

    def pulls_small() -> None:
        from pool.models import PromptGroup

        result["pull_ready_groups_small"] = PromptGroup.objects.filter(ready_at__isnull=False).count()
        small_pulls.update(pull_latency(args.calls, label="small"))
        print(
            f"  pulls at {result['pull_ready_groups_small']:,} ready groups: {small_pulls}", file=sys.stderr
        )

    for strategy in ("uniform", "informative"):
        t = time.perf_counter()
        at = (small, pulls_small) if strategy == "uniform" else None
        signal[strategy] = curriculum(client, strategy, args.groups, args.seed, at=at)
        print(
            f"  {strategy}: signal {signal[strategy]:.3f} in {time.perf_counter() - t:.0f} s", file=sys.stderr
        )
        result[f"signal_{strategy}"] = round(signal[strategy], 4)
    result["informative_over_uniform"] = round(signal["informative"] / signal["uniform"], 3)
    if not args.skip_latency:
        for size, label in ((10_000, "10k"), (100_000, "100k")):
            result[f"sampler_p50_ms_{label}"] = sampler_latency(client, size, args.calls, args.seed)
            print(f"  sampler at {label}: {result[f'sampler_p50_ms_{label}']} ms p50", file=sys.stderr)
        result["sampler_ratio"] = round(result["sampler_p50_ms_100k"] / result["sampler_p50_ms_10k"], 3)
    # Pulls of the groups the runs made ready: oldest ready first, and by priority.
    if not small_pulls:  # fewer groups than the small pulls need: both sizes are the same
        pulls_small()
    pulls = pull_latency(args.calls)
    print(f"  pulls at {2 * args.groups:,} ready groups: {pulls}", file=sys.stderr)
    result["pull_ready_groups"] = 2 * args.groups
    result["pull_priority_p50_ms"] = pulls["priority"]
    result["pull_oldest_p50_ms"] = pulls["oldest"]
    result["pull_priority_p50_ms_small"] = small_pulls["priority"]
    result["pull_oldest_p50_ms_small"] = small_pulls["oldest"]
    result["pull_oldest_ratio"] = round(pulls["oldest"] / small_pulls["oldest"], 3)
    consumed = pull_consumed(args.calls)
    print(f"  pulls after {consumed['taken']:,} groups taken: {consumed}", file=sys.stderr)
    result["pull_consumed_taken_groups"] = consumed["taken"]
    result["pull_consumed_p50_ms"] = consumed["cursor"]
    result["pull_consumed_head_p50_ms"] = consumed["head"]
    result["pull_consumed_ratio"] = round(consumed["cursor"] / pulls["oldest"], 3)
    result["pull_consumed_cursor_over_head"] = round(consumed["cursor"] / consumed["head"], 3)
    targets = {
        f"informative_over_uniform >= {TARGETS['informative_over_uniform']:g}": result[
            "informative_over_uniform"
        ]
        >= TARGETS["informative_over_uniform"]
    }
    if not args.skip_latency:
        for label in ("10k", "100k"):
            targets[f"sampler_p50_ms_{label} <= {TARGETS['sampler_p50_ms']:g}"] = (
                result[f"sampler_p50_ms_{label}"] <= TARGETS["sampler_p50_ms"]
            )
        targets[f"sampler_ratio <= {TARGETS['sampler_ratio']:g}"] = (
            result["sampler_ratio"] <= TARGETS["sampler_ratio"]
        )
    targets[f"pull_oldest_p50_ms <= {TARGETS['pull_oldest_p50_ms']:g}"] = (
        result["pull_oldest_p50_ms"] <= TARGETS["pull_oldest_p50_ms"]
    )
    targets[f"pull_oldest_ratio <= {TARGETS['pull_oldest_ratio']:g}"] = (
        result["pull_oldest_ratio"] <= TARGETS["pull_oldest_ratio"]
    )
    targets[f"pull_consumed_ratio <= {TARGETS['pull_consumed_ratio']:g}"] = (
        result["pull_consumed_ratio"] <= TARGETS["pull_consumed_ratio"]
    )
    result["targets"] = targets
    return result


def difficulties(seed: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.betavariate(0.5, 0.5) for _ in range(N_TASKS)]


def curriculum(
    client, strategy: str, n_groups: int, seed: int, at: tuple[int, Callable] | None = None
) -> float:
    """One W-tasks run through the API; the fraction of groups with reward variance > 0.
    ``at``: (n, fn): call fn once n groups of this run are ready."""
    from pool.models import PromptGroup

    set_name = f"wt-{strategy}"
    hidden = difficulties(seed)
    tasks = [
        {"uid": f"{set_name}-{i}", "set": set_name, "prompt": f"task {i}", "metadata": {"i": i}}
        for i in range(N_TASKS)
    ]
    _ok(client.post("/api/v1/tasks", {"tasks": tasks}, content_type="application/json"), 201)
    rollout_rng = random.Random(seed + 1)
    token_rng = random.Random(0)
    prompt_ids = [token_rng.randrange(150_000) for _ in range(PROMPT)]
    with_signal = done = 0
    version = 0
    while done < n_groups:
        n = min(PER_CALL, n_groups - done)
        body = {"tasks": {"set": set_name}, "n": n, "strategy": strategy, "seed": seed * 1_000_003 + version}
        picked = _ok(client.post("/api/v1/task-sampler", body, content_type="application/json"), 200)["tasks"]
        assert len(picked) == n, len(picked)
        steps, group_uids = [], []
        for k, task in enumerate(picked):
            i = task["metadata"]["i"]
            gid = f"{set_name}-v{version}-{k}"
            group_uids.append(gid)
            body = {"uid": gid, "expected_rollouts": GROUP, "task": task["uid"]}
            _ok(client.post("/api/v1/groups", body, content_type="application/json"), 200)
            p = min(1.0, max(0.0, 1.0 - hidden[i] + 0.0002 * version))
            outcome = [1.0 if rollout_rng.random() < p else 0.0 for _ in range(GROUP)]
            with_signal += max(outcome) != min(outcome)
            for r, reward in enumerate(outcome):
                traj = f"{gid}-{r}"
                steps.append(
                    {
                        "trajectory_uid": traj,
                        "prompt_group_uid": gid,
                        "step_index": 0,
                        "is_last": True,
                        "prompt_ids": prompt_ids,
                        "response_ids": [token_rng.randrange(150_000) for _ in range(RESPONSE)],
                        "policy_version": version,
                        "reward": reward,
                    }
                )
        _ok(client.post("/api/v1/steps", {"steps": steps}, content_type="application/json"), 201)
        ready = PromptGroup.objects.filter(uid__in=group_uids, ready_at__isnull=False).count()
        assert ready == n, f"{ready} of {n} groups ready"
        if at is not None and done < at[0] <= done + n:
            at[1]()
        done += n
        version += 1
        if version % 50 == 0:
            print(f"    {strategy}: {done:,} groups, signal {with_signal / done:.3f}", file=sys.stderr)
    return with_signal / done


def sampler_latency(client, size: int, calls: int, seed: int) -> float:
    """Grow the latency set to ``size`` tasks with random statistics; p50 of informative n=64."""
    from django.db import connection

    from pool.models import Task

    set_name = "latency"
    have = Task.objects.filter(set_name=set_name).count()
    for start in range(have, size, 10_000):
        chunk = [{"uid": f"lat-{i}", "set": set_name} for i in range(start, min(size, start + 10_000))]
        _ok(client.post("/api/v1/tasks", {"tasks": chunk}, content_type="application/json"), 201)
    with connection.cursor() as cur:  # random statistics (setup only; the effect keeps real ones)
        cur.execute("SELECT setseed(%s)", [((seed % 1000) / 1000.0)])
        cur.execute(
            """UPDATE pool_task SET seen = floor(random() * 20), rewarded = 0, recent_rewarded = floor(random() * 40)
               WHERE set_name = %s""",
            [set_name],
        )
        cur.execute(
            """UPDATE pool_task SET recent_passes = floor(random() * (recent_rewarded + 1)) WHERE set_name = %s""",
            [set_name],
        )
        cur.execute(
            """UPDATE pool_task SET recent_pass_rate = (recent_passes + 1) / (recent_rewarded + 2) WHERE set_name = %s""",
            [set_name],
        )
        cur.execute(
            "UPDATE pool_task SET score = recent_pass_rate * (1 - recent_pass_rate) WHERE set_name = %s",
            [set_name],
        )
        cur.execute("VACUUM ANALYZE pool_task") if not connection.in_atomic_block else None
    times = []
    for c in range(calls + 3):
        body = {"tasks": {"set": set_name}, "n": 64, "strategy": "informative", "seed": c}
        t = time.perf_counter()
        got = _ok(client.post("/api/v1/task-sampler", body, content_type="application/json"), 200)
        dt = (time.perf_counter() - t) * 1000
        assert len(got["tasks"]) == 64
        if c >= 3:
            times.append(dt)
    return round(statistics.median(times), 2)


PULL_ORDERS = {"oldest": {}, "priority": {"order": "priority", "priority": "reward_std"}}


def pull_latency(pulls: int, *, label: str = "") -> dict[str, float]:
    """p50 of one pull (8 groups: 64 steps) and its ack by a trainer's key, per serving order:
    oldest ready first (the default) and by priority (highest reward spread first), each a
    dataset of its own over the same ready groups, by consumers of their own (``label``
    names them: each size's pulls start from the oldest ready group); the two take turns
    within each round, so a busy machine slows them alike."""
    from django.db import connection
    from django.test import Client

    from curation.models import Dataset
    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from pool.services.api_keys import api_key_create

    # The statistics a live server's autovacuum keeps (this database server runs with it
    # off, as CI's does): without them PostgreSQL guessed that a pull's 256 trajectories hold
    # 72% of the step table and read all of it (105 ms a pull at 10,000 ready groups,
    # growing with the pool). ANALYZE runs inside a transaction too (the suite's smoke run).
    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    for name, serving in PULL_ORDERS.items():
        if not Dataset.objects.filter(name=f"w-tasks-{name}").exists():
            dataset_create(name=f"w-tasks-{name}", spec={"serving": serving} if serving else None)
    suffix = f"-{label}" if label else ""
    trainer = Client(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='bench-trainer', scopes=[Scope.CONSUME])[1]}"
    )
    times: dict[str, list[float]] = {name: [] for name in PULL_ORDERS}
    for i in range(pulls + 2):
        for name in PULL_ORDERS:
            t = time.perf_counter()
            _pull_ack(trainer, f"curriculum-{name}{suffix}", f"w-tasks-{name}", PULL_GROUPS)
            if i >= 2:
                times[name].append((time.perf_counter() - t) * 1000)
    return {name: round(statistics.median(ts), 2) for name, ts in times.items()}


# The consumers of pull_consumed: their pull cursors' lag (None: the setting's).
CONSUMED = {"cursor": None, "head": 1e10}


def pull_consumed(pulls: int) -> dict:
    """p50 of one pull of 8 groups and its ack after its consumer took CONSUMED_SHARE of the
    ready groups oldest first, with its pull cursor and with one held at the queue's head;
    the two take turns (the module's docstring)."""
    import contextlib

    from django.test import Client, override_settings

    from pool.models import PromptGroup, Scope
    from pool.services.api_keys import api_key_create

    trainer = Client(
        HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='bench-consumed', scopes=[Scope.CONSUME])[1]}"
    )
    ready = PromptGroup.objects.filter(ready_at__isnull=False).count()
    take = min(int(ready * CONSUMED_SHARE), ready - PULL_GROUPS * (pulls + 2))

    def pull(name: str, lag: float | None, n: int) -> None:
        with override_settings(CLAW_PULL_CURSOR_LAG_SECONDS=lag) if lag else contextlib.nullcontext():
            _pull_ack(trainer, f"consumed-{name}", "w-tasks-oldest", n)

    for name, lag in CONSUMED.items():
        left = take
        while left > 0:
            pull(name, lag, min(TAKE_BATCH, left))
            left -= min(TAKE_BATCH, left)
    # The statistics autovacuum would keep after so many deliveries: without them PostgreSQL
    # planned the head's anti-join as if the consumer had taken nothing (3.8 s a pull).
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ANALYZE")
    times: dict[str, list[float]] = {name: [] for name in CONSUMED}
    for i in range(pulls + 2):
        for name, lag in CONSUMED.items():
            t = time.perf_counter()
            pull(name, lag, PULL_GROUPS)
            if i >= 2:
                times[name].append((time.perf_counter() - t) * 1000)
    return {"taken": take, **{name: round(statistics.median(ts), 2) for name, ts in times.items()}}


def _pull_ack(trainer, consumer: str, dataset: str, groups: int) -> None:
    """One pull of ``groups`` whole groups through the API, checked full, and its ack."""
    body = _ok(
        trainer.post(
            f"/api/v1/consumers/{consumer}/pull",
            {"dataset": dataset, "batch_size": groups},
            content_type="application/json",
        ),
        200,
    )
    assert body["lease_id"] and len(body["manifest"]["step_uids"]) == groups * GROUP, body.get("manifest")
    _ok(trainer.post(f"/api/v1/leases/{body['lease_id']}/ack"), 200)


def _ok(resp, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.content[:300])
    return resp.json()


if __name__ == "__main__":
    main()
