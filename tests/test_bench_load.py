"""bench.load, shortened, as a CI test: concurrent openai-SDK agents (half streaming) through
the gateway (`manage.py serve`; 2 worker processes on PostgreSQL) against the demo upstream
with 50 ms latency. No server error, no failed call, and every successful answer stored as a
step. The full run (64 agents, 60 s) is `python -m bench.load`; its figures are in the README."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.live import ROOT

pytestmark = pytest.mark.live


# group size 1: each conversation its own group; 4: GRPO's shape, the agents of each block of
# 4 roll out one prompt into one group, so their first calls race to create the group and
# join it, and later rollouts are stored against its anchor (in two processes on PostgreSQL)
@pytest.mark.parametrize("group_size", ["1", "4"])
def test_a_short_load_run_has_no_5xx_and_loses_no_step(group_size):
    workers = "2" if os.environ.get("DATABASE_URL") else "1"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.load",
            "--agents",
            "12",
            "--seconds",
            "6",
            "--baseline-seconds",
            "1",
            "--workers",
            workers,
            "--group-size",
            group_size,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["workers"] == int(workers)
    assert result["errors_5xx"] == 0 and result["errors_other"] == 0, result
    assert result["responses_ok"] > 0
    assert result["steps_stored"] == result["responses_ok"] and result["lost_steps"] == 0, result
