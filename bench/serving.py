"""bench.serving: pull + ack latency by serving order (specs.Serving) on W-pool at 40k steps.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.serving [--steps 40000] [--pulls 60]

PostgreSQL only: a fresh database (claw_bench_serving_<hex>) is created, migrated and
dropped. W-pool as in bench.curation (groups of 8 rollouts x 4 steps, 200 + 50 tokens per
step, rewards uniform in [0, 1), policy versions 1..5), written through the pool's services,
so every ready group is scored by the effect of GroupsReady (curation GroupScore). One
dataset per serving order, admitting every ready step, whole groups: a 64-step batch is 2
groups. Each measured round is one ``POST /api/v1/consumers/{name}/pull`` and one
``POST /api/v1/leases/{id}/ack`` through Django's test Client (the whole HTTP stack in
process, a consume key), p50 over ``--pulls`` rounds by a fresh consumer per order, the
orders taking turns within each round.

The final JSON line has ``pull_oldest_p50_ms`` (order oldest_ready, the default),
``pull_priority_p50_ms`` (order priority, reward_std: index gscore_spread),
``pull_staleness_p50_ms`` (priority, staleness: gscore_fresh), ``pull_newest_p50_ms``,
``pull_reuse_p50_ms`` (priority reward_std with reuse max_uses 4, decay 0.1) and
``priority_ratio`` = priority / oldest (target <= 1.5). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench.curation import GROUP_STEPS, VERSIONS, WPool, pool_grow, vacuum_analyze
from bench.pgdb import fresh_database

BATCH_GROUPS = 2  # 64 steps
TARGET_RATIO = 1.5
# dataset name -> its serving rules
ORDERS = {
    "oldest": {},
    "priority": {"order": "priority", "priority": "reward_std"},
    "staleness": {"order": "priority", "priority": "staleness"},
    "newest": {"order": "newest_ready"},
    "reuse": {"order": "priority", "priority": "reward_std", "reuse": {"max_uses": 4, "decay": 0.1}},
}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40_000)
    p.add_argument("--pulls", type=int, default=60)
    args = p.parse_args(argv)
    with fresh_database("serving"):
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
    for name, serving in ORDERS.items():
        dataset_create(name=name, spec={"serving": serving})
    key = api_key_create(name="bench-trainer", scopes=[Scope.CONSUME])[1]
    print(f"W-pool: {args.steps:,} steps", file=sys.stderr)
    pool_grow(WPool(), args.steps // GROUP_STEPS)
    vacuum_analyze()
    result: dict = {"workload": "W-pool", "db": "postgresql", "steps": args.steps}
    result["batch_steps"] = BATCH_GROUPS * GROUP_STEPS
    for name, p50 in measure(key, list(ORDERS), args.pulls).items():
        result[f"pull_{name}_p50_ms"] = p50
        print(f"  {name}: p50 {p50} ms", file=sys.stderr)
    result["priority_ratio"] = round(result["pull_priority_p50_ms"] / result["pull_oldest_p50_ms"], 3)
    result["targets"] = {f"priority_ratio <= {TARGET_RATIO:g}": result["priority_ratio"] <= TARGET_RATIO}
    return result


def measure(key: str, datasets: list[str], pulls: int) -> dict[str, float]:
    """p50 (ms) per dataset of pull + ack of 2-group batches by a fresh consumer each; the
    datasets take turns within each round, so a busy machine slows them alike."""
    from django.test import Client

    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    times: dict[str, list[float]] = {d: [] for d in datasets}
    for i in range(pulls + 2):
        for dataset in datasets:
            t = time.perf_counter()
            resp = client.post(
                f"/api/v1/consumers/bench-{dataset}/pull",
                {"dataset": dataset, "batch_size": BATCH_GROUPS},
                content_type="application/json",
            )
            body = resp.json()
            assert resp.status_code == 200 and body["lease_id"], resp.content[:200]
            ack = client.post(f"/api/v1/leases/{body['lease_id']}/ack")
            assert ack.status_code == 200, ack.content[:200]
            assert len(body["manifest"]["step_uids"]) == BATCH_GROUPS * GROUP_STEPS
            if i >= 2:  # warm-up rounds are not counted
                times[dataset].append((time.perf_counter() - t) * 1000)
    return {d: round(statistics.median(ts), 2) for d, ts in times.items()}


if __name__ == "__main__":
    main()
