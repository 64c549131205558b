"""bench.curation: dataset preview, the admin step list and readiness upkeep on W-pool.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.curation \
        [--steps 200000] [--runs 20] [--readiness-steps 12000]

PostgreSQL only: a fresh database (claw_bench_curation_<hex>) is created and migrated for
the run, and dropped at the end. Django runs in this process with the test settings (DEBUG
off, so no query is logged; Celery not eager, so a completed group's prefix-tree merge is
enqueued, as in production, and not computed inline).

W-pool (shared/WORKLOADS.md): groups of 8 rollouts x 4 steps, 200 prompt + 50 response
tokens per step, token ids uniform in [0, 150000) from random.Random(0), drawn in bulk
(``randbytes``, multiply-shift: per-id ``randrange`` alone takes ~65 s at 200k steps on a
loaded 2-core machine). The 8 rollouts' first steps share the group's prompt (what GRPO
sends); later steps are independent. Everything is written through the pool's services:
``group_upsert`` (expected_rollouts=8), ``steps_ingest`` in batches of 32 groups, then
``steps_label``. The shape of each group, from random.Random(1):

* policy version 1 + (group % 5), version 5 current;
* 5% of groups without rewards (pending), 3% with one rollout still running (open group),
  the rest rewarded at ingest (final, one reward per rollout);
* 10% of groups "noisy": each of their steps finishes with "length" (truncated) with odd
  1/2, so ~5% of steps;
* 1% of rollouts labelled "rejected" by an operator (all 4 steps).

Figures, at 20k steps and again after growing the same pool to ``--steps``:

* ``preview_p50_ms``: ``dataset_preview`` of SPEC (fresh within 2 versions, not truncated,
  whole groups), p50 of ``--runs``; checked against what the generator says it must admit;
* ``count_p50_ms``: the baseline, a plain ``SELECT count(*)`` over the step table;
* ``admin_list_p50_ms`` (large size only): Django's test Client, logged in as a superuser,
  GET ADMIN_STEP_URL (asserting 200); baseline ``admin_floor_p50_ms``, the policy-version
  changelist (5 rows): what any admin page costs.

Then ``readiness_steps_per_s``: ``--readiness-steps`` more steps (same shape, policy 5) are
stored without rewards in running trajectories; in batches of 1,000 steps, ``rewards_apply``
gives each its final reward and ``trajectories_complete`` ends the 250 trajectories they
belong to. Steps that became ready (readiness == 15, counted at the end) / wall time of those
calls. Baseline: a plain bulk UPDATE of the reward column of the same 1,000 steps (one
statement, own transaction), run in the same batch loop, alternating which goes first.
``readiness_app_cpu_ms_per_batch``: this process's CPU (Python and the driver; PostgreSQL's
not counted) per timed batch, which other work on the machine disturbs less than the rate.

Before each size is measured the pool is VACUUM ANALYZEd (the state autovacuum reaches after
a bulk load), and the EXPLAIN ANALYZE of the preview and the admin page's slowest statement
go to stderr. Prints progress to stderr, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.pgdb import fresh_database

# The admin changelist measured (one constant, so the filter can be switched).
ADMIN_STEP_URL = "/admin/pool/step/?readiness=ready&quality=truncated"
ADMIN_FLOOR_URL = "/admin/pool/policyversion/"
SPEC = {"filters": {"max_staleness": 2, "exclude_flags": ["truncated"]}}
TARGETS = {"preview_ms": 200.0, "admin_list_ms": 300.0, "readiness_steps_per_s": 5_000.0}

PROMPT, RESPONSE, ROLLOUTS, TURNS = 200, 50, 8, 4
GROUP_STEPS = ROLLOUTS * TURNS
VOCAB = 150_000
VERSIONS = 5  # 1..5, 5 current
BATCH_GROUPS = 32  # groups per steps_ingest call (1,024 steps)
READINESS_BATCH = 1_000  # steps per rewards_apply + trajectories_complete round
WARMUP = 2


@dataclass(slots=True)
class Group:
    index: int
    version: int
    pending: bool  # no rewards
    open: bool  # the last rollout is still running
    truncated: list[list[bool]]  # [rollout][turn]
    rejected: list[bool]  # per rollout
    rewards: list[float]  # per rollout

    @property
    def admitted(self) -> bool:
        """Whether SPEC admits this group (whole groups, n = expected_rollouts = 8)."""
        return (
            self.version >= VERSIONS - 2
            and not self.pending
            and not self.open
            and not any(any(t) for t in self.truncated)
            and not any(self.rejected)
        )


class WPool:
    """The W-pool generator: token ids from random.Random(0), group shapes from Random(1),
    both consumed in group order so a pool grown in parts is the pool built at once."""

    def __init__(self) -> None:
        self.tokens = random.Random(0)
        self.shape = random.Random(1)
        self.next_group = 0

    def ids(self, n: int) -> np.ndarray:
        raw = np.frombuffer(self.tokens.randbytes(4 * n), dtype="<u4").astype(np.uint64)
        return ((raw * VOCAB) >> 32).astype(np.int32)  # uniform in [0, VOCAB), bias < 4e-5

    def group(self) -> Group:
        i, s = self.next_group, self.shape
        self.next_group += 1
        noisy = s.random() < 0.10
        return Group(
            index=i,
            version=1 + i % VERSIONS,
            pending=s.random() < 0.05,
            open=s.random() < 0.03,
            truncated=[[noisy and s.random() < 0.5 for _ in range(TURNS)] for _ in range(ROLLOUTS)],
            rejected=[s.random() < 0.01 for _ in range(ROLLOUTS)],
            rewards=[round(s.random(), 4) for _ in range(ROLLOUTS)],
        )

    def steps(self, g: Group, *, prefix: str = "wp") -> list:
        from pool.ingest.contract import StepIn

        shared = self.ids(PROMPT)
        out = []
        for r in range(ROLLOUTS):
            for t in range(TURNS):
                prompt = shared if t == 0 else self.ids(PROMPT)
                out.append(
                    StepIn(
                        trajectory_uid=f"{prefix}-g{g.index}-r{r}",
                        step_index=t,
                        prompt_ids=prompt,
                        response_ids=self.ids(RESPONSE),
                        prompt_group_uid=f"{prefix}-g{g.index}",
                        reward=None if g.pending else g.rewards[r],
                        policy_version=g.version,
                        is_last=t == TURNS - 1 and not (g.open and r == ROLLOUTS - 1),
                        finish_reason="length" if g.truncated[r][t] else "stop",
                    )
                )
        return out


# --- building ---------------------------------------------------------------------------------
def pool_grow(gen: WPool, n_groups: int, *, prefix: str = "wp") -> list[Group]:
    """Store ``n_groups`` more groups through the services; returns their shapes."""
    from curation.services.labels import steps_label
    from pool.ingest.pipeline import steps_ingest
    from pool.models import Step
    from pool.services.groups import group_upsert

    groups: list[Group] = []
    rejected: list[str] = []
    t0 = time.perf_counter()
    for start in range(0, n_groups, BATCH_GROUPS):
        batch = [gen.group() for _ in range(min(BATCH_GROUPS, n_groups - start))]
        for g in batch:
            group_upsert(uid=f"{prefix}-g{g.index}", expected_rollouts=ROLLOUTS)
        steps_ingest(steps=[s for g in batch for s in gen.steps(g, prefix=prefix)])
        groups.extend(batch)
        rejected += [f"{prefix}-g{g.index}-r{r}" for g in batch for r in range(ROLLOUTS) if g.rejected[r]]
        done = len(groups) * GROUP_STEPS
        if (start // BATCH_GROUPS) % 50 == 49:
            rate = done / (time.perf_counter() - t0)
            print(f"  stored {done:,} steps ({rate:,.0f} steps/s)", file=sys.stderr)
    ids = list(Step.objects.filter(trajectory__uid__in=rejected).values_list("id", flat=True))
    steps_label(step_ids=ids, actor="bench", label="rejected")
    return groups


def vacuum_analyze() -> None:
    """The state a live server's upkeep reaches after a bulk load: celery beat's fold of the
    counters' rows (pool.counters_compact), then autovacuum's VACUUM ANALYZE."""
    from django.db import connection

    from pool.services.counters import counters_compact

    counters_compact()
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE")


# --- measuring --------------------------------------------------------------------------------
def p50_ms(fn: Callable[[], object], runs: int) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 2)


def count_steps() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pool_step")
        return cur.fetchone()[0]


def preview() -> dict:
    from curation.selectors.specs import dataset_preview
    from curation.specs import spec_parse

    return dataset_preview(spec_parse(SPEC))


def explain(fn: Callable[[], object]) -> str:
    """The statements ``fn`` runs (grouped, with count and total time) and the EXPLAIN
    (ANALYZE, BUFFERS) of the slowest one."""
    from django.db import connection

    listing, slowest = statements(fn)
    if connection.vendor != "postgresql":
        return listing
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + slowest)
        plan = "\n".join("    " + row[0] for row in cur.fetchall())
    return f"{listing}\n  plan of the slowest:\n{plan}"


def statements(fn: Callable[[], object]) -> tuple[str, str]:
    """What ``fn`` runs: a listing of its statements grouped by their first 100 characters
    (count x total ms; Django times them to the millisecond), and the slowest read's SQL."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        fn()
    groups: dict[str, list[float]] = {}
    for q in ctx.captured_queries:
        groups.setdefault(q["sql"][:100], []).append(float(q["time"]) * 1000)
    lines = [
        f"    {len(ts):4d} x {sum(ts):8.1f} ms  {key}"
        for key, ts in sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    ]
    # the slowest query (a read): at small sizes a SET LOCAL can be as slow, to the
    # millisecond, and EXPLAIN takes no SET
    reads = [q for q in ctx.captured_queries if q["sql"].lstrip()[:6].upper() in ("SELECT", "WITH")]
    slowest = max(reads or ctx.captured_queries, key=lambda q: float(q["time"]))["sql"]
    return f"  {len(ctx.captured_queries)} statements:\n" + "\n".join(lines), slowest


def measure_size(label: str, groups: list[Group], runs: int, result: dict) -> None:
    steps = count_steps()
    got = preview()
    expected = sum(GROUP_STEPS for g in groups if g.admitted)
    result[f"steps_{label}"] = steps
    result[f"preview_{label}"] = {
        k: got[k] for k in ("steps", "masked_steps", "groups", "dropped_groups")
    } | {"waiting_units": got["waiting_units"]}
    result[f"preview_expected_steps_{label}"] = expected
    result[f"preview_matches_{label}"] = got["steps"] == expected and got["groups"] == expected // GROUP_STEPS
    if not result[f"preview_matches_{label}"]:
        print(
            f"  WARNING: preview admitted {got['steps']} steps, the generator says {expected}",
            file=sys.stderr,
        )
    result[f"preview_p50_ms_{label}"] = p50_ms(preview, runs)
    result[f"count_p50_ms_{label}"] = p50_ms(count_steps, runs)
    result[f"preview_vs_count_{label}"] = round(
        result[f"preview_p50_ms_{label}"] / result[f"count_p50_ms_{label}"], 2
    )
    print(
        f"  {label}: {steps:,} steps; preview p50 {result[f'preview_p50_ms_{label}']} ms "
        f"(admits {got['steps']:,} steps, {got['groups']:,} groups; expected {expected:,}), "
        f"count(*) p50 {result[f'count_p50_ms_{label}']} ms",
        file=sys.stderr,
    )
    print(f"  preview at {label}:\n{explain(preview)}", file=sys.stderr)


def measure_admin(label: str, runs: int, result: dict) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", uuid.uuid4().hex)
    client = Client()
    client.force_login(user)

    def get(url: str) -> Callable[[], None]:
        def run() -> None:
            r = client.get(url)
            if r.status_code != 200:
                raise SystemExit(f"GET {url}: {r.status_code}")

        return run

    result[f"admin_list_p50_ms_{label}"] = p50_ms(get(ADMIN_STEP_URL), runs)
    result[f"admin_floor_p50_ms_{label}"] = p50_ms(get(ADMIN_FLOOR_URL), runs)
    result["admin_list_url"] = ADMIN_STEP_URL
    print(
        f"  admin step list p50 {result[f'admin_list_p50_ms_{label}']} ms "
        f"(policy-version list {result[f'admin_floor_p50_ms_{label}']} ms)\n{explain(get(ADMIN_STEP_URL))}",
        file=sys.stderr,
    )


def measure_readiness(gen: WPool, n_steps: int, result: dict, *, batch: int = READINESS_BATCH) -> None:
    """Store ``n_steps`` unrewarded steps in running trajectories, then make them ready in
    batches of ``batch`` steps; see the module docstring. The first batch is not timed: it
    shows which statements a batch runs."""
    from django.db import connection, transaction

    from pool.flags import READY
    from pool.ingest.pipeline import steps_ingest
    from pool.models import Step
    from pool.services.groups import group_upsert
    from pool.services.rewards import RewardIn, rewards_apply
    from pool.services.trajectories import CompletionIn, trajectories_complete

    n_groups = n_steps // GROUP_STEPS
    prefix = "rd"
    for start in range(0, n_groups, BATCH_GROUPS):
        steps = []
        for g in [gen.group() for _ in range(min(BATCH_GROUPS, n_groups - start))]:
            group_upsert(uid=f"{prefix}-g{g.index}", expected_rollouts=ROLLOUTS)
            g.pending, g.open, g.version = True, True, VERSIONS
            for s in gen.steps(g, prefix=prefix):
                s.is_last = False
                steps.append(s)
        steps_ingest(steps=steps)
    rows = list(
        Step.objects.filter(trajectory__uid__startswith=f"{prefix}-")
        .order_by("trajectory_id", "step_index")  # a batch is whole trajectories
        .values_list("id", "uid", "trajectory__uid")
    )
    rng = random.Random(2)
    service_s = plain_s = service_cpu_s = 0.0
    ready_before = 0

    def ready_count() -> int:
        return Step.objects.filter(trajectory__uid__startswith=f"{prefix}-", readiness=READY).count()

    for b, start in enumerate(range(0, len(rows), batch)):
        chunk = rows[start : start + batch]
        rewards = [round(rng.random(), 4) for _ in chunk]
        trajs = sorted({t for _, _, t in chunk})

        def service(chunk=chunk, rewards=rewards, trajs=trajs) -> None:
            rewards_apply(
                rewards=[
                    RewardIn(reward=r, step_uid=uid) for (_, uid, _), r in zip(chunk, rewards, strict=True)
                ]
            )
            trajectories_complete(completions=[CompletionIn(uid=t) for t in trajs])

        def plain(chunk=chunk, rewards=rewards) -> None:
            values = ", ".join(["(%s, %s)"] * len(chunk))
            params = [x for (sid, _, _), r in zip(chunk, rewards, strict=True) for x in (sid, r)]
            with transaction.atomic(), connection.cursor() as cur:
                # VALUES columns are column1, column2 on PostgreSQL and SQLite alike.
                cur.execute(
                    f"UPDATE pool_step SET reward = v.column2 FROM (VALUES {values}) AS v "
                    "WHERE pool_step.id = v.column1",
                    params,
                )

        if b == 0:  # where a batch's time goes (untimed: the same work as the timed ones)
            plain()
            listing, _ = statements(service)
            print(f"  one batch of rewards_apply + trajectories_complete:\n{listing}", file=sys.stderr)
            ready_before = ready_count()
            continue
        for fn in (service, plain) if b % 2 == 0 else (plain, service):
            t, c = time.perf_counter(), time.process_time()
            fn()
            if fn is service:
                service_s += time.perf_counter() - t
                service_cpu_s += time.process_time() - c
            else:
                plain_s += time.perf_counter() - t
    ready = ready_count()
    if ready != len(rows):
        print(f"  WARNING: {ready} of {len(rows)} steps are ready", file=sys.stderr)
    timed = len(rows) - batch
    result["readiness_steps"] = len(rows)
    result["readiness_ready"] = ready
    result["readiness_steps_per_s"] = round((ready - ready_before) / service_s)
    result["plain_update_steps_per_s"] = round(timed / plain_s)
    # This process's CPU (the app's side: Python, the driver) per ``batch`` timed steps (a
    # short last batch counts for its share), which other work on the machine disturbs less
    # than the rate (PostgreSQL's not counted).
    result["readiness_app_cpu_ms_per_batch"] = round(service_cpu_s * 1000 * batch / timed, 1)
    result["readiness_vs_plain_update"] = round(
        result["readiness_steps_per_s"] / result["plain_update_steps_per_s"], 3
    )
    print(
        f"  readiness: {ready:,} of {len(rows):,} steps ready, {result['readiness_steps_per_s']:,} steps/s "
        f"(plain reward UPDATE {result['plain_update_steps_per_s']:,} steps/s)",
        file=sys.stderr,
    )


def label_of(n_steps: int) -> str:
    return f"{n_steps // 1000}k" if n_steps % 1000 == 0 else str(n_steps)


# --- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200_000, help="the large pool (the small one is 20k)")
    p.add_argument("--runs", type=int, default=20, help="timed runs per latency figure")
    p.add_argument("--readiness-steps", type=int, default=12_000)
    args = p.parse_args(argv)
    if args.readiness_steps // GROUP_STEPS * GROUP_STEPS <= READINESS_BATCH:
        # whole groups are stored, and the first batch is not timed: nothing would be measured
        p.error(
            f"--readiness-steps must hold more than one batch of {READINESS_BATCH:,} steps "
            f"in whole groups of {GROUP_STEPS} (the first batch is not timed)"
        )
    with fresh_database("curation"):
        result = run(args)
    print(json.dumps(result), flush=True)


def run(args: argparse.Namespace) -> dict:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    from pool.services.policy import policy_version_set

    for v in range(1, VERSIONS + 1):
        policy_version_set(version=v)
    sizes = sorted({min(20_000, args.steps), args.steps})
    result: dict = {"workload": "W-pool", "db": "postgresql", "spec": SPEC, "runs": args.runs}
    gen = WPool()
    groups: list[Group] = []
    for size in sizes:
        label = label_of(size)
        want = size // GROUP_STEPS - len(groups)
        print(f"W-pool: growing to {size:,} steps ({want:,} more groups)", file=sys.stderr)
        t = time.perf_counter()
        groups += pool_grow(gen, want)
        result[f"build_steps_per_s_{label}"] = round(want * GROUP_STEPS / (time.perf_counter() - t))
        vacuum_analyze()
        measure_size(label, groups, args.runs, result)
    large = label_of(sizes[-1])
    measure_admin(large, args.runs, result)
    print(f"readiness: {args.readiness_steps:,} steps, batches of {READINESS_BATCH:,}", file=sys.stderr)
    measure_readiness(gen, args.readiness_steps, result)
    result["targets"] = {
        f"preview_p50_ms_{large} <= {TARGETS['preview_ms']:g}": result[f"preview_p50_ms_{large}"]
        <= TARGETS["preview_ms"],
        f"admin_list_p50_ms_{large} <= {TARGETS['admin_list_ms']:g}": result[f"admin_list_p50_ms_{large}"]
        <= TARGETS["admin_list_ms"],
        f"readiness_steps_per_s >= {TARGETS['readiness_steps_per_s']:g}": result["readiness_steps_per_s"]
        >= TARGETS["readiness_steps_per_s"],
    }
    return result


if __name__ == "__main__":
    main()
