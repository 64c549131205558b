"""bench.live submits what its docstring says: at 1,000 steps/s each request is two whole
trajectories, whatever came before it (the warm-up's 50 single steps, the 50 steps/s phase).

A trajectory split between two requests of two sources, sent 16 ms apart, makes the second
request wait on the first's transaction (its uncommitted trajectory row, then the row lock
of the counters). When each request shares a trajectory with the next, the requests of the
phase commit one at a time: pg_stat_activity showed its backends waiting on
Lock:transactionid, and p50_ms_1000 measured that queue (seconds) instead of the live path."""

from __future__ import annotations

from collections import defaultdict

import orjson

from bench.live import PER_TRAJ, RATES, _Steps

# The bench's calls of _Steps.bodies in order (bench/live.py _run): (what, steps, per request).
# The CPU phases' warm-ups and 1,000 steps/s phases follow the two latency phases.
CALLS = [
    ("warm-up", 50, 1),
    ("latency 50/s", 50 * 2, RATES[50]),
    ("latency 1000/s", 1000 * 2, RATES[1000]),
    ("cpu warm-up", 50, 1),
    ("cpu 1000/s", 1000 * 2, RATES[1000]),
    ("cpu warm-up again", 50, 1),
    ("cpu 1000/s again", 1000 * 2, RATES[1000]),
]


def test_no_trajectory_spans_two_requests_at_1000_steps_per_second():
    # given one generator, called as the bench calls it
    gen = _Steps()
    requests_of: dict[str, set[tuple[int, int]]] = defaultdict(set)  # trajectory -> (call, request)
    uids: set[str] = set()
    for call, (what, n_steps, per_request) in enumerate(CALLS):
        bodies = gen.bodies(n_steps, per_request)
        # then each call sends the steps asked for, in requests of its size
        assert len(bodies) == n_steps // per_request, what
        for i, body in enumerate(bodies):
            steps = orjson.loads(body)["steps"]
            assert len(steps) == per_request, (what, i)
            for s in steps:
                requests_of[s["trajectory_uid"]].add((call, i))
                uids.add(s["uid"])
            if per_request % PER_TRAJ == 0:
                # and a 1,000 steps/s request is whole trajectories: indices 0..7, the last is_last
                by_traj: dict[str, list[tuple[int, bool]]] = defaultdict(list)
                for s in steps:
                    by_traj[s["trajectory_uid"]].append((s["step_index"], s["is_last"]))
                assert len(by_traj) == per_request // PER_TRAJ, (what, i)
                for traj, got in by_traj.items():
                    want = [(k, k == PER_TRAJ - 1) for k in range(PER_TRAJ)]
                    assert got == want, (what, i, traj)
    # and no trajectory of a 1,000 steps/s phase is written by two requests (or two calls)
    for traj, where in requests_of.items():
        calls = {c for c, _ in where}
        if any(CALLS[c][2] % PER_TRAJ == 0 for c in calls):
            assert len(where) == 1, (traj, sorted(where))
    # and uids never repeat across the run
    assert len(uids) == sum(n for _, n, _ in CALLS)
