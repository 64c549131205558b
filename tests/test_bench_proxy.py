"""bench.proxy as documented (its workers-scaling phase included), at tiny sizes: a bench that
breaks fails here rather than unseen. The figures themselves are not judged (bench/ measures
them on a quiet machine); only that the run ends with its JSON line, every gateway call stored."""

from __future__ import annotations

import pytest

from tests.test_bench_smoke import run_bench


# CI's PostgreSQL pass skips it: bench.proxy measures the gateway's CPU per call on whichever
# database it finds, and the recording it measures runs on PostgreSQL in tests/gateway/.
@pytest.mark.backend_independent
def test_bench_proxy_runs_every_phase_and_stores_every_call():
    # when bench.proxy runs with its default phases, tiny sizes
    result = run_bench(
        "proxy", "--c1-requests 3 --c32-seconds 0.5 --rounds 1 --concurrency 4 --prompt-chars 200".split()
    )
    # then its last line is the result, with the figures the issues quote
    for key in ("c32_gateway_cpu_ms_per_call", "gateway_over_relay_cpu", "c1_added_p50_ms"):
        assert result[key] > 0, result
    # with the gateway's own account of its c=1 calls (Server-Timing), each call's own time
    # (total less upstream) holding at least its record
    server = {k: result[f"c1_server_{k}_p50_ms"] for k in ("upstream", "record", "total", "own")}
    assert all(v > 0 for v in server.values()), result
    assert result["c32_gateway_rps_workers_1"] > 0 and result["c32_gateway_rps_workers_2"] > 0, result
    # and every call through the gateway is a stored step
    assert result["steps_recorded"] == result["gateway_requests"] > 0, result
