"""The write paths' hot statements are prepared on the PostgreSQL server (pool/prepared.py).

A prepared statement skips parse and plan on each later run. Statements whose best plan
depends on how many ids they carry stay unprepared (the settle of rewards and readiness: its
generic plan ran a 1,000-id batch 3.5x slower, bench.curation). psycopg ignores
``execute(..., prepare=True)`` when the connection's ``prepare_threshold`` is None, Django's
default: the proxy's one-statement write was documented as prepared and never was, and no
figure showed it. So this test reads what the server itself holds (``pg_prepared_statements``
of the test's own session) after each write path ran a few times, one row per path.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from django.db import connection

from pool import prepared
from pool.ingest.contract import StepIn
from pool.ingest.pipeline import AppendTarget, steps_append, steps_ingest
from pool.models import Source, Step

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="prepared statements are PostgreSQL's (SQLite has no planner cost)",
    ),
]


def _step(traj: str, index: int, *, last: bool = False) -> StepIn:
    return StepIn(
        trajectory_uid=traj,
        step_index=index,
        prompt_ids=np.arange(index * 10, index * 10 + 40, dtype=np.int32),
        response_ids=np.arange(7, 15, dtype=np.int32),
        rollout_logprobs=np.linspace(-1.0, -0.1, 8),
        reward=0.5 if last else None,
        is_last=last,
    )


def _white_box(source: Source, on_commit) -> None:
    """Three batches into one trajectory: new trajectory, appends after stored steps, the
    last step with its reward."""
    traj = f"prep-{uuid.uuid4().hex[:8]}"
    for index in range(3):
        steps_ingest(steps=[_step(traj, index, last=index == 2)], source_id=source.id)


def _proxied(source: Source, on_commit) -> None:
    """Three proxied calls of one conversation: the fused claim-and-insert statement (each
    call's commit leaves the process its hint for the next: its on-commit callbacks run)."""
    traj = f"prep-{uuid.uuid4().hex[:8]}"
    prompt = np.arange(0, 40, dtype=np.int32)
    response = np.arange(7, 15, dtype=np.int32)
    for n in range(3):
        if n:  # the next turn: the conversation so far and a new user message
            prompt = np.concatenate([prompt, response, np.arange(100 * n, 100 * n + 12, dtype=np.int32)])
        step = StepIn(
            trajectory_uid="",
            step_index=0,
            prompt_ids=prompt,
            response_ids=response,
            rollout_logprobs=np.linspace(-1.0, -0.1, 8),
            token_source=Step.TokenSource.UPSTREAM,
        )
        with on_commit(execute=True):
            steps_append(
                target=AppendTarget(trajectory_uid=traj, new=n == 0),
                count=1,
                build=lambda tail, step=step: [step],
                source_id=source.id,
            )


# (path, how to run it, a fragment of each statement the server must hold prepared after it)
CASES = [
    (
        "white-box ingest",
        _white_box,
        [
            'UPDATE "pool_trajectory" SET\n            step_count',  # trajectories_after_write
            "SELECT nextval(",  # the COPY's ids
        ],
    ),
    ("proxied call (fused append)", _proxied, ['WITH t AS (UPDATE "pool_trajectory"']),
]


@pytest.mark.parametrize("name,run,fragments", CASES, ids=[c[0] for c in CASES])
def test_each_write_paths_hot_statements_are_prepared_on_the_server(
    name, run, fragments, django_capture_on_commit_callbacks
):
    assert prepared.enabled(connection), "CLAW_DB_PREPARE is on by default on PostgreSQL"
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    run(Source.objects.create(name=f"prep-{uuid.uuid4().hex[:8]}"), django_capture_on_commit_callbacks)
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        held = [row[0] for row in cur.fetchall()]
    missing = [f for f in fragments if not any(f in s for s in held)]
    assert not missing, f"{name}: not prepared: {missing}; the server holds {[s[:80] for s in held]}"
