"""Benches run as documented (`python -m bench.NAME`) at tiny sizes, one row each: a bench
that breaks fails the suite instead of its next user. The figures are not judged here (they
are measured on a quiet machine, docs/benchmarks.md); the run must end with its JSON line
holding the keys the issues and docs quote. bench.proxy, bench.load and bench.prefix_train run
their own main in tests of their own (OWN_TESTS); every other bench module with a main has a
row in BENCHES, and a new one without either fails the suite."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.live import ROOT

PG = bool(os.environ.get("DATABASE_URL"))

# (bench module, its arguments, needs PostgreSQL, keys its result line must hold as numbers)
BENCHES = [
    ("ingest", ["--steps", "200", "--rounds", "1", "--clients", "2"], False, ["ratio", "ratio_msgpack"]),
    ("key_cache", ["--lookups", "2000"], False, ["ratio_ttlcache_over_dict"]),
    ("prefix", ["--repeat", "1"], False, ["speedup", "savings"]),
    ("storage", [], False, ["ratio_to_unique", "ratio_to_naive"]),
    (
        "prefix_forward",
        ["--repeat", "1", "--hidden", "32", "--layers", "1", "--threads", "1"],
        False,
        ["time_ratio", "max_logprob_diff"],
    ),
    (
        "transport",
        ["--c1-requests", "3", "--c32-seconds", "0.5", "--concurrency", "4", "--prompt-chars", "200"],
        False,
        ["cpu_ratio_fast_over_httpx", "c1_p50_ms_fast"],
    ),
    (
        "slow_clients",
        ["--slowloris", "3", "--samples", "10", "--header-timeout", "1", "--body-timeout", "1"],
        False,
        [
            "healthz_p99_ms",
            "healthz_p99_ms_slowloris",
            "api_p99_ms",
            "api_p99_ms_slowloris",
            "closed_by_deadline",
        ],
    ),
    (
        "sse",
        ["--streams", "30"],
        False,
        ["cpu_ratio_httpx_sse_over_hand_written", "spec_passed_hand_written"],
    ),
    ("env_helpers", ["--starts", "2"], False, ["probes_right_hand_written", "import_ms_environs"]),
    ("media", ["--rounds", "1", "--pulls", "2"], False, ["stored_over_unique", "ingest_ratio"]),
    ("learning", ["--steps", "2"], False, ["final_reward", "control_final_reward", "middleware_ms_per_call"]),
    ("pull", ["--steps", "500", "--pulls", "3"], True, ["p50_ms_500", "ratio", "checkpoint_p50_ms_500"]),
    (
        "curation",
        ["--steps", "640", "--runs", "2", "--readiness-steps", "2000"],
        True,
        ["preview_p50_ms_640", "readiness_steps_per_s", "readiness_app_cpu_ms_per_batch"],
    ),
    (
        "curriculum",
        ["--groups", "100", "--calls", "3", "--skip-latency"],
        True,
        ["informative_over_uniform", "pull_oldest_p50_ms", "pull_oldest_ratio", "pull_consumed_ratio"],
    ),
    ("serving", ["--steps", "500", "--pulls", "3"], True, ["pull_oldest_p50_ms", "priority_ratio"]),
    ("live", ["--seconds", "1", "--hello-steps", "5"], True, ["hello_p50_ms_0k"]),
    (
        "growth",
        [
            *("--sizes", "1600,3200", "--runs", "1", "--ingest-batches", "2", "--readiness-steps", "320"),
            *(
                "--soak-seconds",
                "2",
                "--soak-cycle",
                "1",
                "--keep-newest",
                "1600",
                "--soak-rate",
                "200",
                "--soak-workers",
                "1",
            ),
        ],
        True,
        [
            "ingest_steps_per_s_ratio",
            "preview_p50_ms_ratio",
            "preview_live_p50_ms_ratio",
            "preview_restricted_p50_ms_ratio",
            "preview_builder_p50_ms_ratio",
            "overview_p50_ms_ratio",
            "bytes_per_step_ratio",
            "soak_disk_drift",
            "soak_trimmed_leases",
            "soak_turnover_seconds",
            "soak_step_dead_after_vacuum_max",
        ],
    ),
    ("partitions", ["--steps", "6400", "--partitions", "4", "--lookups", "20"], True, ["detach_speedup"]),
]


def run_bench(bench: str, args: list[str]) -> dict:
    """`python -m bench.NAME ARGS` from the project root: it must exit 0, and its last line is
    the result."""
    out = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# CI's second pass (PostgreSQL + Redis) skips these: benches of pure computation (no database,
# no broker, no server), and benches whose smoke checks only that they run and print their
# keys on whichever database they find (the HTTP transport, slow clients, storage, media and the
# learning loop: their database paths run on PostgreSQL in tests of their own, e.g.
# tests/examples/test_learning.py, tests/client/test_client_media.py). A bench that measures
# PostgreSQL (needs_pg) runs in the second pass only; bench.ingest runs in both (its COPY path
# is PostgreSQL's).
BACKEND_FREE = {"key_cache", "prefix", "prefix_forward", "sse", "env_helpers"}
ONE_PASS = BACKEND_FREE | {"storage", "transport", "slow_clients", "media", "learning"}


@pytest.mark.parametrize(
    ("bench", "args", "needs_pg", "keys"),
    [
        pytest.param(*b, id=b[0], marks=[pytest.mark.backend_independent] if b[0] in ONE_PASS else [])
        for b in BENCHES
    ],
)
def test_the_bench_runs_as_documented_and_prints_its_figures(bench, args, needs_pg, keys):
    if needs_pg and not PG:
        pytest.skip(f"bench.{bench} measures PostgreSQL: it runs in CI's PostgreSQL pass")
    # when the bench runs as `python -m bench.NAME`, at tiny sizes
    result = run_bench(bench, args)
    # then its last line is one JSON object holding its figures
    for key in keys:
        assert isinstance(result[key], (int, float)) and not isinstance(result[key], bool), (key, result)


# Benches whose main runs in a test of its own (every phase, with its own checks): the test,
# and how it calls the bench.
OWN_TESTS = {
    "proxy": ("tests/test_bench_proxy.py", 'run_bench(\n        "proxy"'),
    "load": ("tests/test_bench_load.py", '"-m",\n            "bench.load"'),
    "prefix_train": ("tests/test_bench_prefix_train.py", "prefix_train.main("),
}


def test_every_bench_with_a_main_runs_in_the_suite():
    # given every module of bench/ that can be run (`python -m bench.NAME`: it defines main)
    runnable = {
        path.stem
        for path in (ROOT / "bench").glob("*.py")
        if re.search(r"^def main\(", path.read_text(), re.M) and path.stem != "__init__"
    }
    # then each has a row above or a test of its own that runs it as documented
    rows = {row[0] for row in BENCHES}
    assert runnable - rows - set(OWN_TESTS) == set(), "a bench without a smoke row: add one to BENCHES"
    assert rows | set(OWN_TESTS) <= runnable, "a row names a bench that is gone"
    for bench, (test, call) in OWN_TESTS.items():
        assert call in (ROOT / test).read_text(), f"{test} no longer runs bench.{bench}'s main"


@pytest.mark.backend_independent
@pytest.mark.parametrize("steps", ["1000", "1023"])
def test_curation_refuses_readiness_steps_that_would_time_no_batch(steps):
    # given --readiness-steps that fill at most the first, untimed batch (whole groups of 32)
    out = subprocess.run(
        [sys.executable, "-m", "bench.curation", "--readiness-steps", steps],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then it stops before any work with a usage error naming the argument, not a traceback
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--readiness-steps must hold more than one batch of 1,000 steps" in out.stderr
    assert "Traceback" not in out.stderr
