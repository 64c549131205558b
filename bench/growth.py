"""bench.growth: what the pool's everyday operations cost as it grows (W-growth), then a soak
with retention on.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python -m bench.growth \
        [--sizes 100000,1000000,3000000] [--runs 20] [--soak-seconds 600] [--soak-rate 1000]

PostgreSQL only: a fresh database (claw_bench_growth_<hex>) is created, migrated and dropped
(the soak then empties it and starts a new pool there). Run it without REDIS_URL: the pool's
follow-up tasks (prefix-tree merges) then wait in the process's in-memory broker, as in
bench.curation, instead of filling a Redis database that no worker reads.

W-growth (shared/WORKLOADS.md): W-pool's groups (8 rollouts x 4 steps; the shapes of
bench.curation: 5 policy versions, 5% unrewarded, 3% with a running rollout, 10% noisy with
truncated steps, 1% of rollouts labelled rejected) with W-agentic's prefix sharing inside each
rollout: a group's 8 rollouts start from its 200-token prompt, and step t's prompt is step
t-1's prompt + response + a 150-token observation, so every step adds 200 prompt tokens to
its rollout's context and answers 50 (prompts of 200, 400, 600 and 800 tokens). Token ids
from random.Random(0) (bench.curation.WPool.ids). The pool is grown through the pool's
services (steps_ingest in batches of 32 groups, group_upsert, steps_label), the same rows
every door writes, dated one group a second from 400 days ago (``dated``: a pool that has
run for months), and one database goes through every size of ``--sizes``.

The database server here runs with autovacuum off (as CI's does), so the bench does what
autovacuum would on a live server: an ANALYZE each time the pool has grown by a tenth, a
VACUUM (ANALYZE) after each retention pass of the soak. At each size, the saved dataset's
count folds what the growth changed (``count_fold_s``, below), then the pool is VACUUM
ANALYZEd (the state autovacuum reaches after a bulk load: the fold's taken change rows are
dead rows too; read at once, the 3M preview scanned 62,000 of them), then:

* ``ingest_steps_per_s``: white-box steps through the real API (``POST /api/v1/steps``,
  JSON, batches of 100 W-growth steps of groups declared beforehand, through Django's test
  Client: the whole HTTP stack in process, an ingest key): 100 / the median batch's time;
* ``pull_ack_p50_ms``: ``POST /api/v1/consumers/growth/pull`` of 8 groups from a dataset that
  admits every ready group, and the ack of its lease (one consumer, continuing across sizes);
* ``preview_p50_ms``: the preview of a saved dataset of bench.curation's SPEC (fresh within 2
  versions, not truncated, whole groups) as its page and ``GET /api/v1/datasets/{name}/preview``
  read it (``dataset_version_preview``: its kept count, curation/services/counts.py), checked
  equal to the live count at each size; ``count_fold_s``: the fold, before the VACUUM, of
  everything the growth to this size changed into that count (what the periodic sweep does
  every minute on a live server; the first size builds it whole), ``preview_live_p50_ms``:
  ``dataset_preview`` of the same spec counted exactly, live, which reads every step in scope,
  ``preview_restricted_p50_ms``: the saved dataset's preview as a reader restricted to the ingest
  key's source reads it (its units' kept shares, checked equal to its live count at each size),
  and ``preview_builder_p50_ms``: the same as the builder previews an unsaved spec (estimated
  from a sample of CLAW_PREVIEW_SAMPLE_UNITS units on a pool of more than twice as many groups or
  trajectories), with ``preview_builder_error`` (its steps' relative error against the exact
  count), ``preview_builder_margin`` (its stated 95% margin, relative) and whether it sampled;
* ``admin_list_p50_ms``: the admin's step list (bench.curation.ADMIN_STEP_URL) as a superuser;
* ``readiness_steps_per_s``: ``--readiness-steps`` more steps stored unrewarded in running
  trajectories are made ready by ``rewards_apply`` + ``trajectories_complete`` in batches of
  1,000 steps (bench.curation's readiness upkeep): ready steps / time in those calls;
* ``overview_p50_ms``: the dashboard's overview page (``GET /``) as a superuser;
* ``bytes_per_step``: ``pg_total_relation_size`` of the pool app's tables (their indexes and
  TOAST included) over the steps stored.

Each ``<figure>_ratio`` is the largest size's cost over the smallest's (for a throughput, the
smallest's figure over the largest's): 1.0 is flat, higher is worse; the goal is <= 1.3.

The soak (``--soak-seconds``, 0 skips it), on a new pool: the pool is filled (its groups merged,
as the soak's own are: ``merge_fill``) to
``--keep-newest`` steps and brought to its steady state (``turnover``: ``--soak-turnovers`` (2) times as many steps again,
stored in the soak's shape one cycle's worth at a time, each cycle followed by an upkeep
round, so every row the soak's passes remove is one stored as the soak's are, not the bulk
fill's), then a real server process (uvicorn, ``--soak-workers``) takes
W-growth steps at a fixed ``--soak-rate`` (batches of 100 over HTTP), a trainer pulls 8
groups and acks every ``--soak-pull-interval`` seconds (a dataset serving the newest ready
groups first), and every ``--soak-cycle`` seconds a retention pass (``_retention_pass``: the
pool's retention service, a policy keeping the newest steps; in
a process of its own, as a Celery worker's would be) keeps the newest ``--keep-newest``
steps (paced by ``--soak-duty``: CLAW_RETENTION_DUTY), followed by a VACUUM (ANALYZE) of the tables; before it, that process runs celery beat's
other periodic tasks once (``soak_beat_seconds_max``), as a deployment's worker does every minute
(counters folded, kept dataset counts, the readiness sweep...). The pass first trims the leases past
their replay window (``--soak-replay-seconds``, 60: shorter than the kept window, as a
deployment's 7 days are against the months it keeps) and forgets the leases whose units have
all gone (``leases_forget``): the pass is the retention sweep itself. The readiness sweep
abandons the rollouts idle for ``--soak-idle-seconds`` (120; CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS,
3,600 by default, as short against the months a deployment keeps): with the default, a
10-minute soak would keep every group with a rollout that never ends (3% of W-growth's), which
no pass may remove, and the pool would grow by them (about 600 steps a cycle at 400 steps/s).
Passes start every ``--soak-cycle`` seconds from the soak's start, as beat's do (a pass
that overruns is followed at once by the next), so a longer (paced) pass does not lengthen
the cycle nor what each pass removes. ``soak_disk_drift``: the largest
departure of the pool's disk size after a pass from its size after the first pass, over the
latter (and ``soak_disk_drift_after_turnover`` from the first pass after the kept window was
replaced once); ``soak_p99_over_median``: the larger of ingest's and the pull's p99 over
their median request time, with the p99 of the requests that overlapped a pass
(``*_during_passes``: a stall during a retention pass shows there). Each size also measures
``floor_p50_ms`` (an admin page whose work does not depend on the pool) and the load
average: the machine is shared, and ``floor_p50_ms_ratio`` says how much of a ratio is the
machine's. Prints progress on stderr, a table of the figures, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import numpy as np

from bench.curation import (
    ADMIN_STEP_URL,
    GROUP_STEPS,
    PROMPT,
    RESPONSE,
    ROLLOUTS,
    SPEC,
    TURNS,
    VERSIONS,
    Group,
    WPool,
    label_of,
    pool_grow,
    preview,
    statements,
    vacuum_analyze,
)
from bench.pgdb import fresh_database

OBSERVATION = PROMPT - RESPONSE  # a turn adds its response and an observation: 200 prompt tokens
INGEST_BATCH = 100  # steps per POST /api/v1/steps (W-growth)
PULL_GROUPS = 8  # groups per pull (W-growth)
READINESS_BATCH = 1_000  # steps per rewards_apply + trajectories_complete round
WARMUP = 2
GOAL_RATIO = 1.3
SOAK_GOALS = {"soak_disk_drift": 0.1, "soak_p99_over_median": 2.0}
# figure -> True when it is a throughput (its ratio is smallest over largest)
FIGURES = {
    "ingest_steps_per_s": True,
    "pull_ack_p50_ms": False,
    "preview_p50_ms": False,
    "preview_live_p50_ms": False,
    "preview_restricted_p50_ms": False,
    "preview_builder_p50_ms": False,
    "admin_list_p50_ms": False,
    "readiness_steps_per_s": True,
    "overview_p50_ms": False,
    "bytes_per_step": False,
}
OVERVIEW_URL = "/"


def builder_preview() -> dict:
    """The builder's live preview of SPEC as an unsaved spec (estimated on a large pool)."""
    from curation.selectors.specs import dataset_preview
    from curation.specs import spec_parse

    return dataset_preview(spec_parse(SPEC), estimate=True)


FLOOR_URL = "/admin/pool/policyversion/"  # five rows, whatever the pool's size
# The fill is dated as if its groups had arrived one a second (32 steps/s), starting this
# long ago: see ``dated``.
FILL_AGE = timedelta(days=400)
ANALYZE_GROUPS = 1_000  # the least a fill grows between two ANALYZEs (32,000 steps)
PULL_DATASET = "all"  # every ready group, whole (the default spec)
AGENT_SOURCE = "bench-agent"  # the source of the ingest key's steps (a restricted reader's)
PREVIEW_DATASET = "fresh-clean"  # bench.curation's SPEC, saved: its count is kept
SOAK_DATASET = "fresh"  # every ready group, newest ready first (a continuous trainer)


class GrowthGen(WPool):
    """W-growth: bench.curation's W-pool groups, each rollout's prompt extending its previous
    step's prompt + response (see the module docstring)."""

    def steps(self, g: Group, *, prefix: str = "wg") -> list:
        from pool.ingest.contract import StepIn

        shared = self.ids(PROMPT)
        out = []
        for r in range(ROLLOUTS):
            ctx = shared
            for t in range(TURNS):
                response = self.ids(RESPONSE)
                out.append(
                    StepIn(
                        trajectory_uid=f"{prefix}-g{g.index}-r{r}",
                        step_index=t,
                        prompt_ids=ctx,
                        response_ids=response,
                        prompt_group_uid=f"{prefix}-g{g.index}",
                        reward=None if g.pending else g.rewards[r],
                        policy_version=g.version,
                        is_last=t == TURNS - 1 and not (g.open and r == ROLLOUTS - 1),
                        finish_reason="length" if g.truncated[r][t] else "stop",
                    )
                )
                ctx = np.concatenate((ctx, response, self.ids(OBSERVATION)))
        return out


def wire(step) -> dict:
    """A StepIn as the JSON door takes it (orjson writes the numpy arrays as lists)."""
    return {
        "uid": step.uid,
        "trajectory_uid": step.trajectory_uid,
        "step_index": step.step_index,
        "prompt_group_uid": step.prompt_group_uid,
        "prompt_ids": step.prompt_ids,
        "response_ids": step.response_ids,
        "reward": step.reward,
        "policy_version": step.policy_version,
        "is_last": step.is_last,
        "finish_reason": step.finish_reason,
    }


def batches(gen: GrowthGen, n_steps: int, *, prefix: str, declare: Callable[[str], None]):
    """``n_steps`` more W-growth steps in batches of INGEST_BATCH, groups declared (8
    expected rollouts) through ``declare`` before their first step is sent."""
    pending: list = []
    sent = 0
    while sent < n_steps:
        while len(pending) < INGEST_BATCH:
            g = gen.group()
            declare(f"{prefix}-g{g.index}")
            pending += gen.steps(g, prefix=prefix)
        take = min(INGEST_BATCH, n_steps - sent)
        batch, pending = pending[:take], pending[take:]
        sent += take
        yield batch


def p50_ms(fn: Callable[[], object], runs: int) -> float:
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return round(statistics.median(times), 2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


@contextmanager
def dated(gen: GrowthGen, epoch) -> Iterator[None]:
    """The pool's clock (``django.utils.timezone.now``, which every write reads) during a
    fill: ``epoch`` + one second per group generated so far. A pool that runs for months
    holds its steps over months, so the overview's windows (the last 30 minutes' ingest
    rate, the last hour's quality) hold the recent traffic, whatever the pool's size; filled
    at full speed, they would hold the whole pool. Dated so, the fill ends long before the
    measurements, whose own steps (ingest, readiness) are dated now at every size."""
    from django.utils import timezone

    real = timezone.now
    timezone.now = lambda: epoch + timedelta(seconds=gen.next_group)
    try:
        yield
    finally:
        timezone.now = real


def grow_by(gen: GrowthGen, n_groups: int, epoch) -> None:
    """Store ``n_groups`` more W-growth groups (bench.curation.pool_grow, ``dated``), with an
    ANALYZE of the pool's tables each time it has grown by a tenth: what autovacuum's
    analyze does on a live server (this one runs with autovacuum off, as CI's does), so
    the planner knows the tables' sizes."""
    done = 0
    while done < n_groups:
        part = min(n_groups - done, max(ANALYZE_GROUPS, step_count() // GROUP_STEPS // 10))
        with dated(gen, epoch):
            pool_grow(gen, part, prefix="wg")
        done += part
        analyze()


def analyze() -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("ANALYZE")


def autovacuum() -> None:
    """VACUUM (ANALYZE) of the tables a retention pass deletes from: what autovacuum does
    on a live server after many deletes (this one runs with autovacuum off), so their space
    is reused instead of growing."""
    from django.apps import apps
    from django.db import connection

    tables = [
        m._meta.db_table for name in ("pool", "curation") for m in apps.get_app_config(name).get_models()
    ]
    with connection.cursor() as cur:
        cur.execute("VACUUM (ANALYZE) " + ", ".join(connection.ops.quote_name(t) for t in tables))


def fill_epoch():
    from django.utils import timezone

    return timezone.now() - FILL_AGE


# --- the database -----------------------------------------------------------------------------
def step_count() -> int:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pool_step")
        return cur.fetchone()[0]


def pool_bytes() -> int:
    """Bytes on disk of the pool app's tables, with their indexes and TOAST."""
    from django.apps import apps
    from django.db import connection

    tables = [m._meta.db_table for m in apps.get_app_config("pool").get_models()]
    with connection.cursor() as cur:
        cur.execute("SELECT sum(pg_total_relation_size(t::regclass)) FROM unnest(%s::text[]) t", [tables])
        return int(cur.fetchone()[0])


def relation_bytes() -> dict[str, int]:
    """Bytes on disk of each relation of the pool and curation apps: each table's heap,
    its TOAST (``<table> (toast)``) and each of its indexes, by name."""
    from django.apps import apps
    from django.db import connection

    tables = [
        m._meta.db_table for name in ("pool", "curation") for m in apps.get_app_config(name).get_models()
    ]
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT c.relname, pg_relation_size(c.oid),
                   COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0)
            FROM pg_class c WHERE c.relname = ANY(%s)
            UNION ALL
            SELECT i.indexrelid::regclass::text, pg_relation_size(i.indexrelid), 0
            FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid WHERE c.relname = ANY(%s)
            """,
            [tables, tables],
        )
        out: dict[str, int] = {}
        for name, size, toast in cur.fetchall():
            out[name] = int(size)
            if toast:
                out[f"{name} (toast)"] = int(toast)
        return out


def setup_pool() -> dict:
    """Policy versions 1..5 (5 current), the datasets, an ingest and a consume key, a
    superuser: what the measurements use."""
    from django.contrib.auth import get_user_model

    from curation.services.datasets import dataset_create
    from pool.models import Scope
    from pool.services.api_keys import api_key_create
    from pool.services.policy import policy_version_set

    for v in range(1, VERSIONS + 1):
        policy_version_set(version=v)
    dataset_create(name=PULL_DATASET)
    dataset_create(name=SOAK_DATASET, spec={"serving": {"order": "newest_ready"}})
    dataset_create(name=PREVIEW_DATASET, spec=SPEC)
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", uuid.uuid4().hex)
    return {
        "ingest": api_key_create(name=AGENT_SOURCE, scopes=[Scope.INGEST])[1],
        "consume": api_key_create(name="bench-trainer", scopes=[Scope.CONSUME])[1],
        "user": user,
    }


# --- measuring at one size --------------------------------------------------------------------
def measure_ingest(gen: GrowthGen, keys: dict, label: str, n_batches: int) -> float:
    """White-box ingest through the API: 100 / the median batch time (steps/s)."""
    import orjson
    from django.test import Client

    from pool.services.groups import group_upsert

    client = Client(HTTP_AUTHORIZATION=f"Bearer {keys['ingest']}")

    def declare(uid: str) -> None:
        group_upsert(uid=uid, expected_rollouts=ROLLOUTS)

    times = []
    steps = (WARMUP + n_batches) * INGEST_BATCH
    for i, batch in enumerate(batches(gen, steps, prefix=f"in{label}", declare=declare)):
        body = orjson.dumps({"steps": [wire(s) for s in batch]}, option=orjson.OPT_SERIALIZE_NUMPY)
        t = time.perf_counter()
        resp = client.post("/api/v1/steps", body, content_type="application/json")
        dt = time.perf_counter() - t
        if resp.status_code not in (200, 201):
            raise SystemExit(f"POST /api/v1/steps: {resp.status_code} {resp.content[:300]!r}")
        if i >= WARMUP:
            times.append(dt)
    return round(INGEST_BATCH / statistics.median(times))


def pull_ack(client, consumer: str, dataset: str) -> int:
    """One pull of PULL_GROUPS groups and the ack of its lease; returns the steps served."""
    resp = client.post(
        f"/api/v1/consumers/{consumer}/pull",
        {"dataset": dataset, "batch_size": PULL_GROUPS},
        content_type="application/json",
    )
    body = resp.json()
    if resp.status_code != 200 or not body.get("lease_id"):
        raise SystemExit(f"pull: {resp.status_code} {resp.content[:300]!r}")
    ack = client.post(f"/api/v1/leases/{body['lease_id']}/ack")
    if ack.status_code != 200:
        raise SystemExit(f"ack: {ack.status_code} {ack.content[:300]!r}")
    return len(body["manifest"]["step_uids"])


def measure_readiness(gen: GrowthGen, label: str, n_steps: int) -> float:
    """bench.curation's readiness upkeep on W-growth steps: ready steps / time in
    rewards_apply + trajectories_complete, batches of READINESS_BATCH steps."""
    from pool.flags import READY
    from pool.ingest.pipeline import steps_ingest
    from pool.models import Step
    from pool.services.groups import group_upsert
    from pool.services.rewards import RewardIn, rewards_apply
    from pool.services.trajectories import CompletionIn, trajectories_complete

    prefix = f"rd{label}"
    stored = []
    for g in [gen.group() for _ in range(max(1, n_steps // GROUP_STEPS))]:
        group_upsert(uid=f"{prefix}-g{g.index}", expected_rollouts=ROLLOUTS)
        g.pending, g.open, g.version = True, True, VERSIONS
        steps = gen.steps(g, prefix=prefix)
        for s in steps:
            s.is_last = False
        steps_ingest(steps=steps)
        stored += steps
    rng = np.random.default_rng(2)
    took = 0.0
    for start in range(0, len(stored), READINESS_BATCH):
        chunk = stored[start : start + READINESS_BATCH]
        rewards = [
            RewardIn(reward=round(float(r), 4), step_uid=s.uid)
            for s, r in zip(chunk, rng.random(len(chunk)), strict=True)
        ]
        completions = [CompletionIn(uid=t) for t in sorted({s.trajectory_uid for s in chunk})]
        t = time.perf_counter()
        rewards_apply(rewards=rewards)
        trajectories_complete(completions=completions)
        took += time.perf_counter() - t
    ready = Step.objects.filter(uid__in=[s.uid for s in stored], readiness=READY).count()
    if ready != len(stored):
        print(f"  WARNING: {ready} of {len(stored)} readiness steps are ready", file=sys.stderr)
    return round(ready / took)


def count_fold(label: str, result: dict) -> None:
    """The saved dataset's count: built at the first size, then folded with what the growth
    to each size changed (``count_fold_s``)."""
    from curation.models import Dataset
    from curation.services.counts import dataset_count_build

    version = Dataset.objects.get(name=PREVIEW_DATASET).current
    t = time.perf_counter()
    dataset_count_build(version.id)
    result[f"count_fold_s_{label}"] = round(time.perf_counter() - t, 2)


def measure_size(gen: GrowthGen, keys: dict, label: str, args: argparse.Namespace, result: dict) -> None:
    from django.test import Client

    steps = step_count()
    result[f"steps_{label}"] = steps
    result[f"bytes_per_step_{label}"] = round(pool_bytes() / steps, 1)
    from curation.models import Dataset
    from curation.services.counts import dataset_version_preview

    version = Dataset.objects.get(name=PREVIEW_DATASET).current
    live = preview()
    if dataset_version_preview(version) != live:
        raise SystemExit(
            f"the kept count differs from the live one at {label}: {dataset_version_preview(version)} {live}"
        )
    result[f"preview_p50_ms_{label}"] = p50_ms(lambda: dataset_version_preview(version), args.runs)
    result[f"preview_live_p50_ms_{label}"] = p50_ms(preview, args.runs)
    # a reader restricted to the agents' source (a tenant's key): the kept shares of its units
    from curation.selectors.specs import dataset_preview
    from curation.specs import spec_parse
    from pool.models import Source

    mine = frozenset(Source.objects.filter(name=AGENT_SOURCE).values_list("id", flat=True))
    if dataset_version_preview(version, mine) != (want := dataset_preview(spec_parse(SPEC), mine)):
        raise SystemExit(f"a restricted reader's kept count differs from its live one at {label}: {want}")
    result[f"preview_restricted_p50_ms_{label}"] = p50_ms(
        lambda: dataset_version_preview(version, mine), args.runs
    )
    # the builder's live preview of an unsaved spec: estimated from a sample on a large pool
    estimated = builder_preview()
    result[f"preview_builder_p50_ms_{label}"] = p50_ms(builder_preview, args.runs)
    result[f"preview_builder_sampled_{label}"] = estimated["estimate"] is not None
    result[f"preview_builder_error_{label}"] = round(
        abs(estimated["steps"] - live["steps"]) / live["steps"], 4
    )
    result[f"preview_builder_margin_{label}"] = (
        round(estimated["estimate"]["margins"]["steps"] / live["steps"], 4) if estimated["estimate"] else 0.0
    )
    admin = Client()
    admin.force_login(keys["user"])

    def page(url: str) -> Callable[[], None]:
        def get() -> None:
            r = admin.get(url)
            if r.status_code != 200:
                raise SystemExit(f"GET {url}: {r.status_code}")

        return get

    # The machine's speed now: a page whose work does not depend on the pool (five policy
    # versions), and the load average. This machine is shared, so a ratio between two sizes
    # also holds how busy it was at each; floor_p50_ms_ratio says how much.
    result[f"floor_p50_ms_{label}"] = p50_ms(page(FLOOR_URL), args.runs)
    result[f"load_avg_{label}"] = round(os.getloadavg()[0], 2)
    result[f"admin_list_p50_ms_{label}"] = p50_ms(page(ADMIN_STEP_URL), args.runs)
    result[f"overview_p50_ms_{label}"] = p50_ms(page(OVERVIEW_URL), args.runs)
    trainer = Client(HTTP_AUTHORIZATION=f"Bearer {keys['consume']}")
    result[f"pull_ack_p50_ms_{label}"] = p50_ms(lambda: pull_ack(trainer, "growth", PULL_DATASET), args.runs)
    result[f"ingest_steps_per_s_{label}"] = measure_ingest(gen, keys, label, args.ingest_batches)
    result[f"readiness_steps_per_s_{label}"] = measure_readiness(gen, label, args.readiness_steps)
    print(
        f"  {label}: " + ", ".join(f"{f} {result[f'{f}_{label}']:,}" for f in FIGURES),
        file=sys.stderr,
    )
    if args.explain:
        for name, fn in (
            ("preview", preview),
            ("overview", page(OVERVIEW_URL)),
            ("admin list", page(ADMIN_STEP_URL)),
            ("pull + ack", lambda: pull_ack(trainer, "growth", PULL_DATASET)),
        ):
            print(f"  {name} at {label}:\n{explain(fn)}", file=sys.stderr)


def explain(fn: Callable[[], object]) -> str:
    """``fn``'s statements and the EXPLAIN (ANALYZE, BUFFERS) of its slowest read."""
    from django.db import connection

    listing, slowest = statements(fn)
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + slowest)
        plan = "\n".join("    " + row[0] for row in cur.fetchall())
    return f"{listing}\n  plan of the slowest:\n{plan}"


def grow(args: argparse.Namespace) -> dict:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    keys = setup_pool()
    gen = GrowthGen()
    epoch = fill_epoch()
    result: dict = {"workload": "W-growth", "db": "postgresql", "sizes": args.sizes, "runs": args.runs}
    for size in args.sizes:
        label = label_of(size)
        want = max(0, (size - step_count()) // GROUP_STEPS)
        print(f"W-growth: growing to {size:,} steps ({want:,} more groups)", file=sys.stderr)
        t = time.perf_counter()
        grow_by(gen, want, epoch)
        result[f"build_steps_per_s_{label}"] = round(want * GROUP_STEPS / (time.perf_counter() - t))
        count_fold(label, result)
        vacuum_analyze()
        measure_size(gen, keys, label, args, result)
    small, large = label_of(args.sizes[0]), label_of(args.sizes[-1])
    for figure, throughput in FIGURES.items():
        a, b = result[f"{figure}_{small}"], result[f"{figure}_{large}"]
        result[f"{figure}_ratio"] = round(a / b if throughput else b / a, 3)
    result["floor_p50_ms_ratio"] = round(result[f"floor_p50_ms_{large}"] / result[f"floor_p50_ms_{small}"], 3)
    return result


# --- the soak ---------------------------------------------------------------------------------
def _retention_pass(*, keep_newest: int = 200_000) -> dict:
    """One retention sweep (curation/services/retention.py, what celery beat runs) with one
    policy enabled, which deletes everything but the newest groups holding ``keep_newest``
    steps: whole groups, in chunks of one transaction each, pins (the trainer's open leases)
    kept; leases' batches trimmed first, leases forgotten once their units are gone."""
    from curation.models import RetentionPolicy
    from curation.services.retention import retention_sweep

    RetentionPolicy.objects.update_or_create(
        name="soak",
        defaults={"keep_newest_steps": keep_newest, "action": RetentionPolicy.Action.DELETE, "enabled": True},
    )
    sweep = retention_sweep()
    (report,) = sweep.reports
    return {
        "deleted_steps": report.steps,
        "deleted_groups": report.groups,
        "pinned": report.pinned,
        "trimmed_leases": sweep.trimmed_leases,
        "forgotten_leases": report.forgotten_leases + sweep.forgotten_undelivered,
    }


def beat_task(name: str) -> None:
    """One of celery beat's periodic tasks, run in this process by its registered name."""
    from claw_site.celery import app

    app.tasks[name]()


def merge_fill(after: int = 0) -> int:
    """The fill's groups (those of id above ``after``) merged, as the soak's own are by the
    server's follow-up tasks (their prefix-tree layouts): without them the first retention
    passes replace layout-less groups with groups holding one, and the disk grows by those
    layouts until the kept window has turned over once (``soak_disk_drift`` measured that,
    not retention). Returns the highest group id merged."""
    from pool.models import PromptGroup
    from pool.services.merge import group_merge_compute

    t = time.perf_counter()
    ids = list(PromptGroup.objects.filter(id__gt=after).order_by("id").values_list("id", flat=True))
    for gid in ids:
        group_merge_compute(group_id=gid)
    print(f"soak: merged {len(ids):,} groups in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    return ids[-1] if ids else after


def turnover(gen: GrowthGen, args: argparse.Namespace, merged: int) -> dict:
    """The pool brought to its steady state before the soak measures it: ``--soak-turnovers``
    times ``--keep-newest`` more steps stored in the soak's own shape (batches of INGEST_BATCH through the pool's
    write pipeline, each group declared before its first step, dated now), one soak cycle's
    worth at a time (``--soak-rate`` x ``--soak-cycle`` steps), each followed by the soak's
    upkeep round (``upkeep``: the beat's periodic tasks, a retention pass, VACUUM) after its
    groups are merged. The fill is one bulk load: its step rows were rewritten (their groups'
    readiness) before any VACUUM, so its heap holds twice their size, half of it holes, and
    its last rows sit at the heap's end; measured from the fill, the soak's disk rose by the
    holes the soak's rows could not reuse yet, then fell by a sixth at the pass that removed
    the fill's last rows (VACUUM truncating the heap's emptied end: ``pool_step`` -124 MB in
    one pass, 2026-12-06). One turnover is not enough: its first cycle's rows, stored before
    any pass had freed room in the fill's heap, extend the heap's end, and the pass that
    removes them truncates it again (the same fall, -110 MB, at the soak's second pass after a
    single turnover, 2026-12-06); from the second turnover on, each cycle's rows go where
    the last pass freed room. A pool that has run for months has turned over many times: after
    this, every row the soak's retention removes is stored as the soak's own are, and the
    soak's first pass measures a pool in its working shape. ``merged``: the highest group id
    merged so far. Its passes are not paced (nothing else runs)."""
    from pool.ingest.pipeline import steps_ingest
    from pool.services.groups import group_upsert

    def declare(uid: str) -> None:
        group_upsert(uid=uid, expected_rollouts=ROLLOUTS)

    # (at most eight rounds: a tiny soak's cycle would make hundreds)
    per_cycle = max(INGEST_BATCH, int(args.soak_rate * args.soak_cycle), args.keep_newest // 8)
    periodic = _periodic_tasks()
    t0 = time.perf_counter()
    stored, disks = 0, []
    total = args.soak_turnovers * args.keep_newest
    while stored < total:
        n = min(per_cycle, total - stored)
        for batch in batches(gen, n, prefix="tw", declare=declare):
            steps_ingest(steps=batch)
        stored += n
        merged = merge_fill(merged)
        done = upkeep(args.keep_newest, periodic)
        disks.append(done["disk_bytes"])
        print(
            f"soak: turnover {stored:,} of {total:,} steps, "
            f"deleted {done['deleted_steps']:,}, disk {done['disk_bytes'] / 1e6:,.1f} MB "
            f"(step heap: {done['step_dead_after_vacuum']:,} dead after VACUUM, "
            f"{done.get('step_free_mb', '?')} MB free)",
            file=sys.stderr,
        )
    return {"soak_turnover_seconds": round(time.perf_counter() - t0), "soak_turnover_disk_bytes": disks}


def soak(args: argparse.Namespace) -> dict:
    import httpx
    import orjson
    from django.core.management import call_command

    from tests.live import LiveServer

    idle_timeout(args.soak_idle_seconds)  # here (the turnover's upkeep); the retention process sets its own
    # A new pool in the same database: every table emptied (TRUNCATE), then set up again.
    call_command("flush", interactive=False, verbosity=0)
    keys = setup_pool()
    gen = GrowthGen()
    print(f"soak: filling to {args.keep_newest:,} steps", file=sys.stderr)
    grow_by(gen, args.keep_newest // GROUP_STEPS, fill_epoch())
    merged = merge_fill()
    vacuum_analyze()
    warm = turnover(gen, args, merged)
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        # No REDIS_URL: the soak's follow-up tasks run in its server process, and its live
        # events stay there (not in a Redis database other servers' dashboards listen on).
        server = LiveServer(
            Path(tmp),
            {"DATABASE_URL": os.environ["DATABASE_URL"], "CLAW_API_KEY_CACHE_SECONDS": "10", "REDIS_URL": ""},
        )
        server.extra_args = ["--workers", str(args.soak_workers)] if args.soak_workers > 1 else []
        server.start(migrate=False)
        try:
            result = _soak_run(args, server.url, keys, gen, httpx, orjson)
        finally:
            server.close()
    return warm | result


def _soak_run(args, url: str, keys: dict, gen: GrowthGen, httpx, orjson) -> dict:
    stop = threading.Event()
    # (start, ms) of each request: whether it overlapped a retention pass is decided after
    ingest_ms: list[tuple[float, float]] = []
    pull_ms: list[tuple[float, float]] = []
    errors: list[str] = []
    sent = [0]
    interval = INGEST_BATCH / args.soak_rate

    def ingest() -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {keys['ingest']}"}, timeout=120
        ) as c:

            def declare(uid: str) -> None:
                r = c.post("/api/v1/groups", json={"uid": uid, "expected_rollouts": ROLLOUTS})
                if r.status_code not in (200, 201):
                    errors.append(f"groups: {r.status_code} {r.text[:200]}")

            due = time.monotonic()
            for batch in batches(gen, 10**12, prefix="sk", declare=declare):
                body = orjson.dumps({"steps": [wire(s) for s in batch]}, option=orjson.OPT_SERIALIZE_NUMPY)
                wait = due - time.monotonic()
                if wait > 0 and stop.wait(wait):
                    return
                if stop.is_set():
                    return
                t = time.monotonic()
                r = c.post("/api/v1/steps", content=body, headers={"Content-Type": "application/json"})
                ingest_ms.append((t, (time.monotonic() - t) * 1000))
                if r.status_code not in (200, 201):
                    errors.append(f"steps: {r.status_code} {r.text[:200]}")
                    return
                sent[0] += len(batch)
                due += interval

    def pull() -> None:
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {keys['consume']}"}, timeout=120
        ) as c:
            while not stop.wait(args.soak_pull_interval):
                t = time.monotonic()
                r = c.post(
                    "/api/v1/consumers/soak/pull", json={"dataset": SOAK_DATASET, "batch_size": PULL_GROUPS}
                )
                if r.status_code != 200:
                    errors.append(f"pull: {r.status_code} {r.text[:200]}")
                    return
                lease = r.json().get("lease_id")
                if lease:
                    a = c.post(f"/api/v1/leases/{lease}/ack")
                    if a.status_code != 200:
                        errors.append(f"ack: {a.status_code} {a.text[:200]}")
                        return
                pull_ms.append((t, (time.monotonic() - t) * 1000))

    # Retention runs in a process of its own, as a Celery worker's would: never in the
    # threads that time the requests (a pass holding their interpreter would show as stalls).
    # The replay window the retention process applies (its settings are read from the
    # environment when it starts): a deployment keeps more than its replay window (30 days
    # kept, 7 of replay); with the 7-day default here, every unit the soak's trainer pulled
    # would stay pinned and every lease keep its batch for the whole soak.
    os.environ["CLAW_RETENTION_REPLAY_DAYS"] = str(args.soak_replay_seconds / 86_400)
    os.environ["CLAW_RETENTION_DUTY"] = str(args.soak_duty)
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    retention = spawn.Process(
        target=_retention_worker, args=(theirs, args.keep_newest, args.soak_idle_seconds), daemon=True
    )
    retention.start()
    threads = [threading.Thread(target=ingest, daemon=True), threading.Thread(target=pull, daemon=True)]
    t0 = time.monotonic()
    for th in threads:
        th.start()
    passes: list[dict] = []
    windows: list[tuple[float, float]] = []  # (start, end) of each pass, vacuum included
    try:
        # Passes start on a fixed schedule (the k-th at k x --soak-cycle), as celery beat's
        # do: a longer pass (a paced one) does not lengthen the cycle, so each pass removes
        # one cycle's steps whatever its duty. A pass that overruns its cycle is followed at
        # once by the next.
        due = t0
        while time.monotonic() - t0 < args.soak_seconds and not errors:
            due += args.soak_cycle
            time.sleep(max(0.0, min(due, t0 + args.soak_seconds) - time.monotonic()))
            if time.monotonic() - t0 > args.soak_seconds + 1:
                break
            start = time.monotonic()
            ours.send(True)
            done = ours.recv()
            windows.append((start, time.monotonic()))
            done["sent"] = sent[0]
            passes.append(done)
            shown = {k: v for k, v in done.items() if k != "relations"}
            print(f"  soak {time.monotonic() - t0:5.0f} s: pass {shown}", file=sys.stderr)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=120)
        ours.send(None)
        retention.join(timeout=120)
    elapsed = time.monotonic() - t0
    if errors:
        raise SystemExit(f"soak: {errors[:3]}")
    if not ingest_ms or not pull_ms:
        raise SystemExit(f"soak: {len(ingest_ms)} ingest batches and {len(pull_ms)} pulls: too short")
    return _soak_figures(args, elapsed, sent[0], passes, windows, {"ingest": ingest_ms, "pull": pull_ms})


def _soak_figures(args, elapsed: float, sent: int, passes: list[dict], windows, samples: dict) -> dict:
    """The soak's JSON keys. ``soak_disk_drift``: the largest departure of the pool's disk
    size after a pass from its size after the first, over the latter;
    ``soak_disk_drift_after_turnover`` the same from the first pass after the kept window
    was replaced once (the steps sent since the first pass reach ``keep_newest``), when a
    later pass exists: during the first turnover the indexes and the heap still take their
    working shape. ``soak_p99_over_median``: the larger of ingest's and the pull's p99 over
    their median request time; ``*_during_passes``: the p99 of the requests that overlapped
    a retention pass over the same median."""
    disks = [p["disk_bytes"] for p in passes]
    out = {
        "soak_seconds": round(elapsed),
        "soak_rate_target": args.soak_rate,
        "soak_rate_achieved": round(sent / elapsed),
        "soak_keep_newest": args.keep_newest,
        "soak_replay_seconds": args.soak_replay_seconds,
        "soak_duty": args.soak_duty,
        "soak_idle_seconds": args.soak_idle_seconds,
        "soak_step_live": [p.get("step_live") for p in passes],
        "soak_turnovers": args.soak_turnovers,
        "soak_trimmed_leases": sum(p.get("trimmed_leases", 0) for p in passes),
        "soak_forgotten_leases": sum(p.get("forgotten_leases", 0) for p in passes),
        "soak_passes": len(passes),
        "soak_pass_seconds_max": max((p["seconds"] for p in passes), default=None),
        "soak_vacuum_seconds_max": max((p["vacuum_seconds"] for p in passes), default=None),
        "soak_beat_seconds_max": max((p.get("beat_seconds", 0) for p in passes), default=None),
        "soak_disk_bytes": disks,
        # Why the disk moved: the step heap's dead versions a VACUUM could not remove yet, its
        # free space after it, and the oldest other snapshot as the VACUUM started.
        "soak_step_dead_after_vacuum": [p.get("step_dead_after_vacuum") for p in passes],
        "soak_step_dead_after_vacuum_max": max(
            (p.get("step_dead_after_vacuum", 0) for p in passes), default=0
        ),
        "soak_step_free_mb": [p.get("step_free_mb") for p in passes],
        "soak_horizon_xids_max": max((p.get("horizon_xids", 0) for p in passes), default=None),
        "soak_oldest_xact_s_max": max((p.get("oldest_xact_s", 0) for p in passes), default=None),
        "soak_deleted_steps": [p.get("deleted_steps") for p in passes],
        "soak_disk_drift": round(max(abs(d - disks[0]) for d in disks) / disks[0], 3) if disks else None,
        "soak_disk_drift_after_turnover": None,
    }
    turned = [i for i, p in enumerate(passes) if passes and p["sent"] - passes[0]["sent"] >= args.keep_newest]
    if turned and turned[0] < len(passes) - 1:
        base = disks[turned[0]]
        out["soak_disk_drift_after_turnover"] = round(
            max(abs(d - base) for d in disks[turned[0] :]) / base, 3
        )
    if len(passes) > 1:
        # Where the disk went between the first pass and the last: the relations that grew
        # (or shrank) the most, in bytes.
        first, last = passes[0].get("relations", {}), passes[-1].get("relations", {})
        moved = {k: last.get(k, 0) - first.get(k, 0) for k in first.keys() | last.keys()}
        out["soak_growth_by_relation"] = dict(sorted(moved.items(), key=lambda kv: -abs(kv[1]))[:10])
    ratios = []
    for name, values in samples.items():
        ms = [v for _t, v in values]
        median = statistics.median(ms)
        during = [v for t, v in values if any(a - v / 1000 <= t <= b for a, b in windows)]
        out[f"soak_{name}_p50_ms"] = round(median, 1)
        out[f"soak_{name}_p99_ms"] = round(percentile(ms, 0.99), 1)
        out[f"soak_p99_over_median_{name}"] = round(percentile(ms, 0.99) / median, 2)
        out[f"soak_{name}_requests_during_passes"] = len(during)
        out[f"soak_p99_over_median_{name}_during_passes"] = (
            round(percentile(during, 0.99) / median, 2) if during else None
        )
        ratios.append(out[f"soak_p99_over_median_{name}"])
    out["soak_p99_over_median"] = max(ratios)
    return out


def _periodic_tasks() -> list[str]:
    """celery beat's periodic tasks but retention's (the pass is retention's own)."""
    from claw_site.management.commands.serve import beat_schedule

    return [p.task for p in beat_schedule() if p.name != "retention"]


def upkeep(keep_newest: int, periodic: list[str]) -> dict:
    """One round of what a deployment's worker does each cycle: the beat's other periodic
    tasks (the counters folded, the kept dataset counts, the readiness sweep, leases
    expired...), then a retention pass and its VACUUM; returns the pass's figures with the
    disk after it."""
    t = time.perf_counter()
    for task in periodic:
        beat_task(task)
    beat_seconds = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    done = _retention_pass(keep_newest=keep_newest)
    done["beat_seconds"] = beat_seconds
    done["seconds"] = round(time.perf_counter() - t, 2)
    done |= horizon()
    t = time.perf_counter()
    autovacuum()
    done["vacuum_seconds"] = round(time.perf_counter() - t, 2)
    done |= step_heap()
    done["disk_bytes"] = pool_bytes()
    done["relations"] = relation_bytes()
    return done


def horizon() -> dict:
    """What could hold VACUUM's horizon back as it starts: the oldest snapshot (``backend_xmin``)
    and the oldest transaction among the other sessions, in XIDs and seconds."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT COALESCE(max(age(backend_xmin)), 0),
                   COALESCE(extract(epoch FROM max(now() - xact_start)), 0),
                   count(*) FILTER (WHERE state = 'idle in transaction')
            FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND datname = current_database()
            """
        )
        xids, seconds, idle = cur.fetchone()
    return {"horizon_xids": int(xids), "oldest_xact_s": round(float(seconds), 1), "idle_in_xact": int(idle)}


def step_heap() -> dict:
    """The step table's heap after a VACUUM: the dead row versions it could not remove yet
    (``n_dead_tup``, which VACUUM sets to those), the live ones, and its free space as the
    free-space map records it (pg_freespacemap, where it can be created), in MB."""
    from django.db import DatabaseError, connection, transaction

    with connection.cursor() as cur:
        cur.execute("SELECT n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'pool_step'")
        live, dead = cur.fetchone()
        out = {"step_live": int(live), "step_dead_after_vacuum": int(dead)}
        try:
            with transaction.atomic():
                cur.execute("CREATE EXTENSION IF NOT EXISTS pg_freespacemap")
                cur.execute("SELECT COALESCE(sum(avail), 0) FROM pg_freespace('pool_step')")
                out["step_free_mb"] = round(int(cur.fetchone()[0]) / 1e6, 1)
        except DatabaseError:  # the extension is optional (not installed, or no right to create it)
            pass
    return out


def idle_timeout(seconds: float) -> None:
    """The readiness sweep's idle timeout (CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS) in this process."""
    from django.conf import settings

    settings.CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS = int(seconds)


def _retention_worker(pipe, keep_newest: int, idle_seconds: float) -> None:
    """The soak's retention process: each time it is asked, an upkeep round, its figures
    sent back; None ends it."""
    import django

    django.setup()
    idle_timeout(idle_seconds)
    periodic = _periodic_tasks()
    while pipe.recv() is not None:
        pipe.send(upkeep(keep_newest, periodic))


# --- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="100000,1000000,3000000", help="pool sizes, in steps, ascending")
    p.add_argument("--runs", type=int, default=20, help="timed runs per latency figure")
    p.add_argument("--ingest-batches", type=int, default=30, help="timed 100-step batches per size")
    p.add_argument("--readiness-steps", type=int, default=4_000)
    p.add_argument(
        "--explain", action="store_true", help="EXPLAIN ANALYZE the slowest statement of each read"
    )
    p.add_argument("--soak-seconds", type=float, default=600, help="0: no soak")
    p.add_argument("--soak-rate", type=float, default=1_000, help="steps/s sent during the soak")
    p.add_argument("--soak-cycle", type=float, default=60, help="seconds between retention passes")
    p.add_argument("--soak-pull-interval", type=float, default=0.5)
    p.add_argument("--soak-workers", type=int, default=2, help="server processes of the soak")
    p.add_argument(
        "--soak-replay-seconds",
        type=float,
        default=60,
        help="the replay window of the soak's retention (CLAW_RETENTION_REPLAY_DAYS, in seconds)",
    )
    p.add_argument(
        "--soak-idle-seconds",
        type=float,
        default=120,
        help="rollouts idle this long are abandoned (CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS)",
    )
    p.add_argument(
        "--soak-turnovers",
        type=int,
        default=2,
        help="times the kept window is replaced before the soak measures (turnover)",
    )
    p.add_argument(
        "--soak-duty",
        type=float,
        default=1.0,
        help="the share of its time a retention pass works (CLAW_RETENTION_DUTY)",
    )
    p.add_argument("--keep-newest", type=int, default=200_000, help="steps the soak's retention keeps")
    args = p.parse_args(argv)
    args.sizes = sorted(int(s) for s in args.sizes.split(","))
    with fresh_database("growth"):
        result = grow(args)
        if args.soak_seconds > 0:
            result |= soak(args)
    result["targets"] = {f"{f}_ratio <= {GOAL_RATIO}": result[f"{f}_ratio"] <= GOAL_RATIO for f in FIGURES}
    for key, goal in SOAK_GOALS.items():
        if key in result:
            result["targets"][f"{key} <= {goal}"] = result[key] <= goal
    print(table(result), file=sys.stderr)
    print(json.dumps(result), flush=True)


def table(result: dict) -> str:
    """The figures as a Markdown table: one row per figure, one column per size."""
    labels = [label_of(s) for s in result["sizes"]]
    lines = [
        "| figure | " + " | ".join(labels) + " | ratio |",
        "| --- | " + " | ".join("---:" for _ in labels) + " | ---: |",
    ]
    for f in FIGURES:
        cells = " | ".join(f"{result[f'{f}_{lab}']:,}" for lab in labels)
        lines.append(f"| {f} | {cells} | {result[f'{f}_ratio']} |")
    cells = " | ".join(f"{result[f'floor_p50_ms_{lab}']:,}" for lab in labels)
    lines.append(f"| (machine) floor_p50_ms | {cells} | {result['floor_p50_ms_ratio']} |")
    cells = " | ".join(f"{result[f'load_avg_{lab}']}" for lab in labels)
    lines.append(f"| (machine) load_avg | {cells} | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
