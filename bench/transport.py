"""bench.transport: the gateway's upstream transport, httpx's own vs FastTransport, in one run.

    python -m bench.transport [--c1-requests 200] [--c32-seconds 3] [--prompt-chars 2400]

Workload: bench.proxy's (2.4k-token chat, zero-latency upstream: distinct ~2.4k-token toy
prompts, 12-40 answer tokens, a new trajectory and one recorded step per call). Two gateway
processes run side by side on the same demo upstream, identical but for
CLAW_UPSTREAM_TRANSPORT: ``httpx`` (httpx.AsyncHTTPTransport: httpcore + h11 + anyio) and
``fast`` (claw_kit/llm/transport.py). Blocks alternate in the order httpx, fast, fast, httpx
so that drift in the machine's load hits both alike:

* concurrency 1: latency p50 of each, after a warm-up;
* concurrency 32, a fixed duration each: the gateway process's CPU time per call (user +
  system, from /proc), and requests/s.

Ratios are fast / httpx. Prints progress on stderr, then one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench.proxy import (
    Target,
    cpu_seconds,
    install_uvloop,
    load_arguments,
    make_bodies,
    pct,
    run_c1,
    run_concurrent,
    start_upstream,
)
from tests.live import LiveServer

KINDS = ("httpx", "fast")
ORDER = ("httpx", "fast", "fast", "httpx")  # ABBA: a linear drift weighs on both alike
WARMUP = 100


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(p, c1_requests=200, c32_seconds=3.0)  # per transport, split over its blocks
    args = p.parse_args(argv)
    install_uvloop()
    upstream_url, upstream = start_upstream()
    log(f"demo upstream at {upstream_url} (zero latency)")
    tmp = tempfile.TemporaryDirectory()
    servers: dict[str, LiveServer] = {}
    try:
        for kind in KINDS:
            env = {
                "CLAW_UPSTREAM_URL": f"{upstream_url}/v1",
                "CLAW_API_KEY_CACHE_SECONDS": "60",
                "CLAW_UPSTREAM_TRANSPORT": kind,
            }
            var_dir = Path(tmp.name) / kind  # each its own SQLite file when DATABASE_URL is unset
            var_dir.mkdir()
            servers[kind] = LiveServer(var_dir, env).start()
        db = "postgresql" if servers["fast"].env.get("DATABASE_URL") else "sqlite"
        targets = {}
        pids = {}
        for kind, server in servers.items():
            key = server.make_key("ingest", "read", name=f"bench-transport-{kind}")
            targets[kind] = Target(
                kind, server.url, "/v1/chat/completions", {"authorization": f"Bearer {key}"}
            )
            assert server.proc is not None
            pids[kind] = server.proc.pid
            log(f"gateway ({kind} transport) at {server.url}, {db}")
        bodies = make_bodies(2 * WARMUP + 2 * args.c1_requests + 4096, args.prompt_chars, seed=0)
        result = asyncio.run(_measure(args, targets, pids, bodies))
        result.update(
            db=db,
            workload=(
                f"bench.proxy's: chat completions, {args.prompt_chars}-char (~{args.prompt_chars}-token toy) "
                "distinct prompts, new trajectory per call, demo upstream zero latency"
            ),
        )
        print(json.dumps(result), flush=True)
    finally:
        for server in servers.values():
            server.close()
        upstream.terminate()
        upstream.wait(10)
        tmp.cleanup()


async def _measure(
    args: argparse.Namespace, targets: dict[str, Target], pids: dict[str, int], bodies: list[bytes]
) -> dict:
    pos = 0

    def take(k: int) -> list[bytes]:
        nonlocal pos
        out = bodies[pos : pos + k]
        pos += k
        return out

    for kind in KINDS:  # connections, imports, caches, the database's first plans
        await run_c1(targets[kind], take(WARMUP))
    log(f"warm-up done ({WARMUP} calls each)")

    blocks = ORDER.count("fast")
    lat: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for kind in ORDER:
        lat[kind] += await run_c1(targets[kind], take(args.c1_requests // blocks))
        log(f"c=1 {kind}: p50 {statistics.median(lat[kind]):.2f} ms so far")

    rest = bodies[pos:]
    calls = {kind: 0 for kind in KINDS}
    secs = {kind: 0.0 for kind in KINDS}
    cpu = {kind: 0.0 for kind in KINDS}
    for kind in ORDER:
        before = cpu_seconds(pids[kind])
        n, s = await run_concurrent(targets[kind], rest, args.concurrency, args.c32_seconds / blocks)
        cpu[kind] += cpu_seconds(pids[kind]) - before
        calls[kind] += n
        secs[kind] += s
        log(
            f"c={args.concurrency} {kind}: {n / s:.0f} req/s, {cpu[kind] / calls[kind] * 1000:.3f} ms CPU/call so far"
        )

    cpu_ms = {kind: cpu[kind] / calls[kind] * 1000 for kind in KINDS}
    p50 = {kind: pct(lat[kind], 0.5) for kind in KINDS}
    rps = {kind: calls[kind] / secs[kind] for kind in KINDS}
    return {
        "gateway_cpu_ms_per_call_httpx": round(cpu_ms["httpx"], 3),
        "gateway_cpu_ms_per_call_fast": round(cpu_ms["fast"], 3),
        "cpu_ratio_fast_over_httpx": round(cpu_ms["fast"] / cpu_ms["httpx"], 3),
        "cpu_saved_ms_per_call": round(cpu_ms["httpx"] - cpu_ms["fast"], 3),
        "c1_p50_ms_httpx": round(p50["httpx"], 3),
        "c1_p50_ms_fast": round(p50["fast"], 3),
        "p50_ratio_fast_over_httpx": round(p50["fast"] / p50["httpx"], 3),
        f"c{args.concurrency}_rps_httpx": round(rps["httpx"], 1),
        f"c{args.concurrency}_rps_fast": round(rps["fast"], 1),
        "rps_ratio_fast_over_httpx": round(rps["fast"] / rps["httpx"], 3),
        "calls": sum(calls.values()) + sum(len(v) for v in lat.values()) + WARMUP * len(KINDS),
        "concurrency": args.concurrency,
    }


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
