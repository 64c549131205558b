"""bench.pull: pull + ack latency of 64-step batches on W-pool at 20k and 200k steps.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.pull [--steps 200000] [--pulls 60]

PostgreSQL only: a fresh database (claw_bench_pull_<hex>) is created, migrated and dropped.
W-pool as in bench.curation (groups of 8 rollouts x 4 steps, 200 + 50 tokens per step), all
written through the pool's services. A dataset admitting every ready step, whole groups:
a 64-step batch is 2 groups. Each measured round is one ``POST /api/v1/consumers/{name}/pull``
and one ``POST /api/v1/leases/{id}/ack`` through Django's test Client (the whole HTTP stack
in process, a consume key), p50 and p99 over ``--pulls`` rounds, at 20k and again after
growing the pool to ``--steps``, by a fresh consumer and by the 20k consumer continuing.

Baseline, same run: ``read_p50_ms``, reading and rendering the same 64 steps by id
(``pool.selectors.steps_render``): what serving those steps costs without any leasing.

Lineage (on unless ``--no-lineage``): each consumer trains within a run (``POST
/api/v1/runs``) and each round, after its ack, publishes a policy version with ``"run"`` (a
checkpoint taking that ack; ``"current": false``, so serving is untouched), timed apart:
``checkpoint_p50_ms_<size>``. The pull + ack round is measured exactly as without lineage, so
its p50 compared with a run of the code before lineage (same command, same sitting) is the
cost per pull of recording it. ``index_ms_per_checkpoint``: indexing the checkpoints' steps
afterwards (curation.checkpoints_index), per checkpoint.
Then ``snapshot_steps_per_s``: a snapshot of the same dataset at the large size (every
admitted step, written as JSONL and Parquet), steps / wall time. Prints progress on stderr
and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench.curation import GROUP_STEPS, VERSIONS, WPool, label_of, pool_grow, vacuum_analyze
from bench.pgdb import fresh_database

BATCH_GROUPS = 2  # 64 steps
TARGETS = {"p50_ms": 50.0, "ratio": 1.5, "snapshot_steps_per_s": 5_000.0}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--pulls", type=int, default=60)
    p.add_argument("--no-lineage", dest="lineage", action="store_false", help="no runs, no checkpoints")
    args = p.parse_args(argv)
    with fresh_database("pull"):
        result = run(args)
    print(json.dumps(result), flush=True)


def run(args: argparse.Namespace) -> dict:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from pool.services.api_keys import api_key_create
    from pool.services.policy import policy_version_set

    for v in range(1, VERSIONS + 1):
        policy_version_set(version=v)
    dataset_create(name="all")
    key = api_key_create(name="bench-trainer", scopes=[Scope.CONSUME, Scope.POLICY])[1]
    gen = WPool()
    result: dict = {"workload": "W-pool", "db": "postgresql", "batch_steps": BATCH_GROUPS * GROUP_STEPS}
    lineage = getattr(args, "lineage", True)
    result["lineage"] = lineage
    built = 0
    for size in sorted({min(20_000, args.steps), args.steps}):
        label = label_of(size)
        print(f"W-pool: growing to {size:,} steps", file=sys.stderr)
        pool_grow(gen, size // GROUP_STEPS - built)
        built = size // GROUP_STEPS
        vacuum_analyze()
        fresh = measure(key, f"fresh-{label}", args.pulls, lineage=lineage)
        result[f"p50_ms_{label}"], result[f"p99_ms_{label}"] = fresh["p50"], fresh["p99"]
        result[f"read_p50_ms_{label}"] = fresh["read_p50"]
        cont = measure(key, "continuing", args.pulls, lineage=lineage)
        result[f"continuing_p50_ms_{label}"] = cont["p50"]
        if lineage:
            result[f"checkpoint_p50_ms_{label}"] = fresh["checkpoint_p50"]
        print(f"  {label}: fresh {fresh}, continuing {cont}", file=sys.stderr)
    if lineage:
        result["index_ms_per_checkpoint"] = measure_index()
    small, large = label_of(min(20_000, args.steps)), label_of(args.steps)
    result["ratio"] = round(result[f"p50_ms_{large}"] / result[f"p50_ms_{small}"], 3)
    snap = measure_snapshot()
    result["snapshot_steps"] = snap["steps"]
    result["snapshot_steps_per_s"] = snap["steps_per_s"]
    result["targets"] = {
        f"p50_ms_{large} <= {TARGETS['p50_ms']:g}": result[f"p50_ms_{large}"] <= TARGETS["p50_ms"],
        f"ratio <= {TARGETS['ratio']:g}": result["ratio"] <= TARGETS["ratio"],
        f"snapshot_steps_per_s >= {TARGETS['snapshot_steps_per_s']:g}": result["snapshot_steps_per_s"]
        >= TARGETS["snapshot_steps_per_s"],
    }
    return result


def measure_snapshot() -> dict:
    """Build a snapshot of the dataset at the large size (JSONL and Parquet, through the
    default storage, into a temporary media root): admitted steps / wall time of
    snapshot_create + snapshot_build, the way the Celery task runs it."""
    import tempfile

    from django.conf import settings
    from django.core.files.storage import storages

    from curation.services.snapshots import snapshot_build, snapshot_create

    with tempfile.TemporaryDirectory() as media:
        settings.MEDIA_ROOT = media
        storages._storages.clear()  # the default storage re-reads MEDIA_ROOT
        t = time.perf_counter()
        snap = snapshot_create(dataset="all", actor="bench")
        done = snapshot_build(snapshot_id=snap.id)
        dt = time.perf_counter() - t
    assert done is not None and done.status == "done", done
    steps = done.manifest["steps"]
    print(f"  snapshot: {steps:,} steps in {dt:.1f} s", file=sys.stderr)
    return {"steps": steps, "steps_per_s": round(steps / dt)}


def measure_index() -> float:
    """Index every checkpoint's steps (what curation.checkpoints_index does after the
    fact): ms per checkpoint."""
    from curation.services.lineage import checkpoints_index_pending

    t = time.perf_counter()
    n = checkpoints_index_pending(limit=None)
    dt = (time.perf_counter() - t) * 1000
    print(f"  indexed {n} checkpoints in {dt:.0f} ms", file=sys.stderr)
    return round(dt / max(n, 1), 2)


_versions = iter(range(VERSIONS + 1, 10**9))  # checkpoint versions, never current


def measure(key: str, consumer: str, pulls: int, *, lineage: bool = False) -> dict:
    from django.test import Client

    from pool.selectors.steps import steps_listed, steps_render

    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    if lineage:
        run = client.post(
            "/api/v1/runs",
            {"uid": consumer, "consumer": consumer, "dataset": "all"},
            content_type="application/json",
        )
        assert run.status_code in (200, 201), run.content[:200]
    times, reads, checkpoints = [], [], []
    for i in range(pulls + 2):
        t = time.perf_counter()
        resp = client.post(
            f"/api/v1/consumers/{consumer}/pull",
            {"dataset": "all", "batch_size": BATCH_GROUPS},
            content_type="application/json",
        )
        body = resp.json()
        assert resp.status_code == 200 and body["lease_id"], resp.content[:200]
        ack = client.post(f"/api/v1/leases/{body['lease_id']}/ack")
        assert ack.status_code == 200, ack.content[:200]
        dt = (time.perf_counter() - t) * 1000
        assert len(body["manifest"]["step_uids"]) == BATCH_GROUPS * GROUP_STEPS
        if lineage:  # the trainer publishes its next version: a checkpoint taking this ack
            t = time.perf_counter()
            cp = client.post(
                "/api/v1/policy-versions",
                {"version": next(_versions), "current": False, "run": consumer},
                content_type="application/json",
            )
            assert cp.status_code == 200 and cp.json()["checkpoint"]["leases"] == 1, cp.content[:200]
            if i >= 2:
                checkpoints.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        steps_render(list(steps_listed().filter(uid__in=body["manifest"]["step_uids"])))
        if i >= 2:  # warm-up rounds are not counted
            times.append(dt)
            reads.append((time.perf_counter() - t) * 1000)
    times.sort()
    return {
        "p50": round(statistics.median(times), 2),
        "p99": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "read_p50": round(statistics.median(reads), 2),
        "checkpoint_p50": round(statistics.median(checkpoints), 2) if checkpoints else None,
    }


if __name__ == "__main__":
    main()
