"""bench.live: the live dashboard's latency (submission to websocket event) and its CPU cost.

    python -m bench.live [--seconds 10] [--latency-only]

A real server process (uvicorn, tests/live.py; SQLite, or a fresh PostgreSQL database when
DATABASE_URL is set, and the Redis channel layer when REDIS_URL is set), a logged-in
websocket client (``websockets``, the session cookie of a real Django session) on
``ws/live/?topics=steps``, and steps submitted through ``POST /api/v1/steps`` at a fixed
pace. Steps are W-ingest-shaped (shared/WORKLOADS.md: 1,000 prompt + 200 response tokens,
200 logprobs and a reward, 8 steps per trajectory; token ids uniform in [0, 150000), seeded
with 0), in two paces instead of W-ingest's batches of 100:

* 50 steps/s: one step per request, 50 requests/s;
* 1,000 steps/s: 16 steps (two whole trajectories) per request, 62.5 requests/s.

Each phase starts a fresh trajectory (the warm-up's 50 single steps end mid-trajectory): a
trajectory split between two concurrent requests makes the second wait for the first's
commit, and a chain of them runs the requests one at a time (tests/test_bench_live.py).
``--latency-only`` skips the CPU phases.

Latency: coalescing caps the lists of an event (``recent``, ``trajectories``), but its
per-source counts are exact, so requests are matched by count: they are sent round robin by
SOURCES sources (one API key each), so one source's requests are 256 ms apart and commit in
order, and request i of a source is delivered by the first event after which that source's
``by_source`` total reaches its steps through request i. Latency = event received - request
sent, so it includes the request itself (``response_p50_ms``; ``after_response_*``: event
received - response received). ``matched``: the share of requests delivered within 10 s.

CPU: the server process's CPU time (psutil, user + system) per step at 1,000 steps/s with
the websocket connected vs the same ingest with no websocket connected;
``cpu_overhead`` = connected / none - 1; ``cpu_overhead_idle`` compares nobody connected with
live events switched off (CLAW_LIVE=0, a restart): none / off - 1. Phases run in the order
none, connected, off, off, connected, none. Prints progress, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import orjson
import psutil
import websockets

from tests.live import LiveServer

PROMPT, RESPONSE, PER_TRAJ = 1_000, 200, 8
RATES = {50: 1, 1000: 16}  # steps/s -> steps per request
SOURCES = 16  # API keys (sources) the requests rotate over


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0, help="per measured phase")
    p.add_argument(
        "--hello-steps",
        type=int,
        default=0,
        help="instead: time the hello state (live_state) on a W-pool of 20k and this many steps (PostgreSQL)",
    )
    p.add_argument(
        "--latency-only", action="store_true", help="skip the CPU phases (latency at both paces only)"
    )
    args = p.parse_args(argv)
    if args.hello_steps:
        print(json.dumps(hello_state(args.hello_steps)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-live-") as tmp:
        server = LiveServer(Path(tmp), {"CLAW_API_KEY_CACHE_SECONDS": "10"})
        server.start()
        try:
            out = asyncio.run(_run(server, args.seconds, cpu_phases=not args.latency_only))
        finally:
            server.close()
    print(json.dumps(out), flush=True)


async def _run(server: LiveServer, seconds: float, *, cpu_phases: bool = True) -> dict:
    cookie, keys = _session(server)
    gen = _Steps()
    headers = {"Content-Type": "application/json"}
    ws_url = server.url.replace("http://", "ws://") + "/ws/live/?topics=steps"
    ws_headers = {"Cookie": f"sessionid={cookie}", "Origin": server.url}
    out: dict = {
        "workload": "W-ingest-shaped steps, 50 steps/s (1 per request) and 1,000 steps/s (16 per request)",
        "db": "postgresql" if "DATABASE_URL" in server.env else "sqlite",
        "layer": "redis" if os.environ.get("REDIS_URL") else "in-memory",
        "seconds": seconds,
    }
    http = httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60)
    try:
        await _submit(http, gen.bodies(50, 1), 50, keys)  # warm-up: imports, keys, connections
        for rate in (50, 1000):
            async with websockets.connect(ws_url, additional_headers=ws_headers) as ws:
                hello = orjson.loads(await ws.recv())
                assert hello["type"] == "hello", hello
                bodies = gen.bodies(int(rate * seconds), RATES[rate])
                lat, after, answered, matched = await _measure(http, ws, bodies, rate, keys)
            suffix = "" if rate == 50 else f"_{rate}"
            out[f"p50_ms{suffix}"] = round(_pct(lat, 50), 1)
            out[f"p99_ms{suffix}"] = round(_pct(lat, 99), 1)
            # the request alone (sent -> response), and the event after the response
            out[f"response_p50_ms{suffix}"] = round(_pct(answered, 50), 1)
            out[f"after_response_p50_ms{suffix}"] = round(_pct(after, 50), 1)
            out[f"after_response_p99_ms{suffix}"] = round(_pct(after, 99), 1)
            out[f"matched{suffix}"] = round(matched, 3)
            print(f"rate {rate}/s: p50 {out[f'p50_ms{suffix}']} ms, p99 {out[f'p99_ms{suffix}']}", flush=True)
        if not cpu_phases:
            return out
        # CPU per step at 1,000 steps/s: connected, nobody connected, and live events off
        # (CLAW_LIVE=0, a restart), in a balanced order.
        cpu: dict[str, list[float]] = {"none": [], "connected": [], "off": []}
        for phase in ("none", "connected", "off", "off", "connected", "none"):
            # A fresh process per phase: none inherits another phase's heap or caches.
            await http.aclose()
            server.env["CLAW_LIVE"] = "0" if phase == "off" else "1"
            server.restart()
            http = httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60)
            await _submit(http, gen.bodies(50, 1), 50, keys)
            proc = psutil.Process(server.proc.pid)  # type: ignore[union-attr]
            bodies = gen.bodies(int(1000 * seconds), RATES[1000])
            steps = len(bodies) * RATES[1000]
            ws = None
            if phase == "connected":
                ws = await websockets.connect(ws_url, additional_headers=ws_headers)
                await ws.recv()
                drain = asyncio.create_task(_drain(ws))
            before = _cpu(proc)
            await _submit(http, bodies, 1000 / RATES[1000], keys)
            used = _cpu(proc) - before
            if ws is not None:
                drain.cancel()
                await ws.close()
            cpu[phase].append(used / steps * 1e6)
            print(f"cpu {phase}: {cpu[phase][-1]:.0f} us/step", flush=True)
    finally:
        await http.aclose()
    mean = {phase: statistics.mean(v) for phase, v in cpu.items()}
    for phase, v in mean.items():
        out[f"cpu_us_per_step_{phase}"] = round(v, 1)
    out["cpu_overhead"] = round(mean["connected"] / mean["none"] - 1, 3)
    out["cpu_overhead_idle"] = round(mean["none"] / mean["off"] - 1, 3)  # live on, nobody connected
    return out


def hello_state(steps: int, runs: int = 20) -> dict:
    """p50 of ``live_state`` (every topic: what an overview page reads on each connect) on
    a W-pool (bench/curation.py) of 20k and ``steps`` steps, in a fresh PostgreSQL
    database, after VACUUM ANALYZE (the planner estimates are then current)."""
    from bench.curation import GROUP_STEPS, WPool, pool_grow, vacuum_analyze
    from bench.pgdb import fresh_database

    out: dict = {"workload": "W-pool", "db": "postgresql", "runs": runs}
    with fresh_database("live"):
        import django
        from django.core.management import call_command
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        django.setup()
        call_command("migrate", verbosity=0)
        from curation.selectors.live import live_state

        gen, grown = WPool(), 0
        for size in sorted({min(20_000, steps), steps}):
            want = size // GROUP_STEPS - grown
            pool_grow(gen, want)
            grown += want
            vacuum_analyze()
            label = f"{size // 1000}k"
            times = []
            for _ in range(runs + 3):
                t = time.perf_counter()
                state = live_state(["overview"])
                times.append((time.perf_counter() - t) * 1e3)
            out[f"hello_p50_ms_{label}"] = round(statistics.median(times[3:]), 2)
            out[f"hello_steps_{label}"] = state["collect"]["steps"]
            with CaptureQueriesContext(connection) as q:
                live_state(["overview"])
            out["hello_queries"] = len(q.captured_queries)
            print(f"{label}: hello p50 {out[f'hello_p50_ms_{label}']} ms", file=sys.stderr, flush=True)
    return out


def _cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def _measure(
    http: httpx.AsyncClient, ws, bodies: list[bytes], per_s: float, keys: list[tuple[str, str]]
) -> tuple[list[float], list[float], list[float], float]:
    """Submit at ``per_s`` steps/s while reading events; latency per request (see the module
    docstring)."""
    sent: list[float] = []
    done: dict[int, float] = {}
    arrivals: dict[str, list[tuple[int, float]]] = {name: [] for name, _ in keys}  # (total, time)

    async def read() -> None:
        totals = dict.fromkeys(arrivals, 0)
        while True:
            msg = orjson.loads(await ws.recv())
            now = time.perf_counter()
            for event in msg.get("events", []):
                if event["kind"] == "steps":
                    for name, n in event["data"]["by_source"].items():
                        if name in totals:
                            totals[name] += n
                            arrivals[name].append((totals[name], now))

    reader = asyncio.create_task(read())
    per_request = len(orjson.loads(bodies[0])["steps"])
    target = [(i // len(keys) + 1) * per_request for i in range(len(bodies))]
    await _submit(http, bodies, per_s / per_request, keys, sent=sent, done=done)
    deadline = time.perf_counter() + 10
    names = [keys[i % len(keys)][0] for i in range(len(bodies))]
    while time.perf_counter() < deadline and not all(
        arrivals[n] and arrivals[n][-1][0] >= t for n, t in zip(names, target, strict=True)
    ):
        await asyncio.sleep(0.05)
    reader.cancel()
    lat, after = [], []
    answered = [(done[i] - sent[i]) * 1e3 for i in range(len(bodies))]
    for i, (name, want) in enumerate(zip(names, target, strict=True)):
        t1 = next((t for total, t in arrivals[name] if total >= want), None)
        if t1 is not None:
            lat.append((t1 - sent[i]) * 1e3)
            after.append((t1 - done[i]) * 1e3)
    return lat, after, answered, len(lat) / len(bodies)


async def _submit(
    http: httpx.AsyncClient,
    bodies: list[bytes],
    per_s: float,
    keys: list[tuple[str, str]],
    *,
    sent: list[float] | None = None,
    done: dict[int, float] | None = None,
) -> None:
    """POST each body at its scheduled time (``per_s`` requests per second, concurrently
    when the server is slower than the pace), round robin over the sources' keys; waits for
    every response."""
    start = time.perf_counter()
    tasks = []

    async def post(i: int, body: bytes) -> None:
        auth = {"Authorization": f"Bearer {keys[i % len(keys)][1]}"}
        r = await http.post("/api/v1/steps", content=body, headers=auth)
        if done is not None:
            done[i] = time.perf_counter()
        if r.status_code != 201:
            raise SystemExit(f"API error {r.status_code}: {r.text[:300]}")

    for i, body in enumerate(bodies):
        delay = start + i / per_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sent is not None:
            sent.append(time.perf_counter())
        tasks.append(asyncio.create_task(post(i, body)))
    await asyncio.gather(*tasks)


async def _drain(ws) -> None:
    while True:
        await ws.recv()


class _Steps:
    """W-ingest-shaped steps, numbered across the whole run (uids never repeat)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.n = 0

    def bodies(self, n_steps: int, per_request: int) -> list[bytes]:
        # Each call starts a fresh trajectory, so that 16 steps per request are two whole
        # trajectories, as the module docstring says: a trajectory split between two
        # concurrent requests (of two sources) makes the second wait for the first's
        # transaction (its uncommitted trajectory row), and when every request shares one
        # with the next, the requests of a phase run one at a time.
        self.n = -(-self.n // PER_TRAJ) * PER_TRAJ
        return [
            orjson.dumps({"steps": [self._step() for _ in range(per_request)]})
            for _ in range(0, n_steps, per_request)
        ]

    def _step(self) -> dict:
        traj, idx = divmod(self.n, PER_TRAJ)
        self.n += 1
        return {
            "uid": f"bl-{self.n}",
            "trajectory_uid": f"bl-t{traj}",
            "step_index": idx,
            "prompt_ids": self.rng.integers(0, 150_000, PROMPT).tolist(),
            "response_ids": self.rng.integers(0, 150_000, RESPONSE).tolist(),
            "rollout_logprobs": (-self.rng.random(RESPONSE) * 10).tolist(),
            "reward": float(self.rng.random()),
            "is_last": idx == PER_TRAJ - 1,
        }


def _session(server: LiveServer) -> tuple[str, list[tuple[str, str]]]:
    """A logged-in session of a superuser (made by Django itself in the server's database)
    and SOURCES ingest keys, each granted every bench source (requests take turns on the
    trajectories): (session key, [(source name, key)])."""
    code = (
        "from django.contrib.auth import get_user_model, SESSION_KEY, BACKEND_SESSION_KEY, HASH_SESSION_KEY;"
        "from django.contrib.sessions.backends.db import SessionStore;"
        "from pool.services.api_keys import api_key_create;"
        "U = get_user_model();"
        "u = U.objects.create_superuser('bench', 'bench@example.com', 'pw-bench');"
        "s = SessionStore();"
        "s[SESSION_KEY] = str(u.pk);"
        "s[BACKEND_SESSION_KEY] = 'django.contrib.auth.backends.ModelBackend';"
        "s[HASH_SESSION_KEY] = u.get_session_auth_hash();"
        "s.create();"
        "print(s.session_key);"
        "from pool.models import Source;"
        f"names = ['bench-%d' % i for i in range({SOURCES})];"
        "[Source.objects.get_or_create(name=n) for n in names];"
        # the keys take turns on every trajectory: each is granted the others' sources
        "[print(n, api_key_create(name=n, scopes=['ingest'], extra_sources=[m for m in names if m != n])[1])"
        " for n in names]"
    )
    lines = server.manage("shell", "-c", code).strip().splitlines()[-SOURCES - 1 :]
    return lines[0], [(name, key) for name, key in (line.split() for line in lines[1:])]


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(values, q))


if __name__ == "__main__":
    sys.exit(main())
