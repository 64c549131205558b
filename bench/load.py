"""bench.load: many black-box agents at once through the gateway, for a fixed time.

    python -m bench.load [--agents 64] [--seconds 60] [--latency-ms 50] [--turns 4] [--workers 1]
        [--group-size 1]

Workload (issue [8/9]): 64 concurrent black-box agents, each one the official ``openai`` SDK
(AsyncOpenAI), run multi-turn conversations (``--turns`` calls per trajectory, each call
with the whole history, every other agent streaming) through the gateway's scoped URL
``/t/<trajectory>/<group>/v1`` (a group of its own per conversation; ``--group-size`` k: the
agents of each block of k roll out one prompt into one group, as GRPO does) against the demo
upstream (claw_site/demo/upstream.py) with ``--latency-ms`` added to every upstream request.
The gateway is ``manage.py serve`` with ``--workers`` uvicorn processes on the database
named by DATABASE_URL (a fresh PostgreSQL database, created and migrated for the run) or
SQLite.

It prints requests/s, latency p50/p99 (as an agent sees it: to the last byte), the number
of 5xx answers and of other failures, and the steps stored against the successful
responses: every successful response must be a stored step (zero lost) and nothing may
fail. One JSON line at the end, with the baseline (the same agents against the upstream
direct, in the same run) for a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import httpx
import openai

from bench.proxy import install_uvloop, pct, start_upstream
from tests.live import LiveServer


class Tally:
    def __init__(self) -> None:
        self.ok = 0
        self.errors_5xx = 0
        self.errors_other = 0
        self.latencies: list[float] = []
        self.first_error: str | None = None

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, openai.APIStatusError) and exc.status_code >= 500:
            self.errors_5xx += 1
        else:
            self.errors_other += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"[:300]


async def agent(
    i: int, base: str, key: str, turns: int, until: float, tally: Tally, scoped: bool, group_size: int = 1
) -> None:
    """One black-box agent: conversations of ``turns`` calls until the deadline."""
    rng = random.Random(i)
    stream = i % 2 == 1
    n = 0
    http = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=2))
    try:
        while time.monotonic() < until:
            uid = f"load-a{i}-c{n}"
            # GRPO (``--group-size`` k): agents i // k roll out the same prompt into one group
            block = i // group_size
            prompt_rng = rng if group_size == 1 else random.Random(block * 1_000_003 + n)
            group = f"g-{uid}" if group_size == 1 else f"g-load-b{block}-c{n}"
            n += 1
            url = f"{base}/t/{uid}/{group}/v1" if scoped else f"{base}/v1"
            client = openai.AsyncOpenAI(base_url=url, api_key=key, http_client=http, max_retries=0)
            messages = [
                {"role": "system", "content": "You are a careful agent. " * 20},
                {
                    "role": "user",
                    "content": f"task {i if group_size == 1 else block}-{n}: "
                    + " ".join(str(prompt_rng.randrange(10**6)) for _ in range(40)),
                },
            ]
            for _t in range(turns):
                if time.monotonic() >= until:
                    break
                t0 = time.perf_counter()
                try:
                    if stream:
                        parts = []
                        async with await client.chat.completions.create(
                            model="demo", messages=messages, max_tokens=24, stream=True
                        ) as s:
                            async for chunk in s:
                                if chunk.choices and chunk.choices[0].delta.content:
                                    parts.append(chunk.choices[0].delta.content)
                        reply = "".join(parts)
                    else:
                        resp = await client.chat.completions.create(
                            model="demo", messages=messages, max_tokens=24
                        )
                        reply = resp.choices[0].message.content or ""
                except Exception as exc:  # noqa: BLE001 - counted, the agent goes on
                    tally.fail(exc)
                    break
                tally.latencies.append((time.perf_counter() - t0) * 1000)
                tally.ok += 1
                messages += [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": f"observation {rng.randrange(10**6)}"},
                ]
    finally:
        await http.aclose()


async def run(base: str, key: str, args: argparse.Namespace, scoped: bool) -> tuple[Tally, float]:
    tally = Tally()
    t0 = time.monotonic()
    until = t0 + args.seconds
    await asyncio.gather(
        *(agent(i, base, key, args.turns, until, tally, scoped, args.group_size) for i in range(args.agents))
    )
    return tally, time.monotonic() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--latency-ms", type=float, default=50.0)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--baseline-seconds", type=float, default=10.0)
    p.add_argument(
        "--group-size",
        type=int,
        default=1,
        help="GRPO: this many agents roll out each prompt into one prompt group (default 1: a group per conversation)",
    )
    args = p.parse_args(argv)
    install_uvloop()
    upstream_url, upstream = start_upstream(args.latency_ms)
    tmp = tempfile.TemporaryDirectory()
    server = LiveServer(
        Path(tmp.name),
        {"CLAW_UPSTREAM_URL": f"{upstream_url}/v1", "CLAW_API_KEY_CACHE_SECONDS": "60", "CLAW_DEMO": "0"},
        serve=True,
    )
    server.extra_args = ["--workers", str(args.workers)]
    try:
        server.start()
        db = "postgresql" if server.env.get("DATABASE_URL") else "sqlite"
        key = server.make_key("ingest", "read", name="bench-load")
        print(
            f"gateway at {server.url} ({args.workers} worker(s), {db}); upstream +{args.latency_ms:g} ms",
            flush=True,
        )
        # Baseline: the same agents against the upstream direct (no recording), shorter.
        base_args = argparse.Namespace(**{**vars(args), "seconds": args.baseline_seconds})
        direct, direct_s = asyncio.run(run(upstream_url, "none", base_args, scoped=False))
        print(
            f"direct: {direct.ok / direct_s:.1f} req/s, p50 {pct(direct.latencies, 0.5):.1f} ms", flush=True
        )
        tally, elapsed = asyncio.run(run(server.url, key, args, scoped=True))
        stats = httpx.get(
            f"{server.url}/api/v1/stats", headers={"Authorization": f"Bearer {key}"}, timeout=60
        ).json()
        result = {
            "workload": (
                f"{args.agents} concurrent openai-SDK agents (half streaming), {args.turns}-turn conversations "
                f"through /t/<traj>/<group>/v1, demo upstream +{args.latency_ms:g} ms, {args.seconds:g} s"
                + (f", {args.group_size} rollouts of each prompt in one group" if args.group_size > 1 else "")
            ),
            "db": db,
            "workers": args.workers,
            "rps": round(tally.ok / elapsed, 1),
            "p50_ms": round(pct(tally.latencies, 0.5), 1) if tally.latencies else None,
            "p99_ms": round(pct(tally.latencies, 0.99), 1) if tally.latencies else None,
            "errors_5xx": tally.errors_5xx,
            "errors_other": tally.errors_other,
            "first_error": tally.first_error,
            "responses_ok": tally.ok,
            "steps_stored": stats["steps"],
            "lost_steps": max(0, tally.ok - stats["steps"]),
            "direct_rps": round(direct.ok / direct_s, 1),
            "direct_p50_ms": round(pct(direct.latencies, 0.5), 1) if direct.latencies else None,
            "rps_ratio_to_direct": round((tally.ok / elapsed) / (direct.ok / direct_s), 3)
            if direct.ok
            else None,
        }
        result["targets"] = {
            "errors_5xx == 0": result["errors_5xx"] == 0 and result["errors_other"] == 0,
            "lost_steps == 0": result["lost_steps"] == 0 and result["steps_stored"] >= result["responses_ok"],
        }
        print(json.dumps(result), flush=True)
    finally:
        server.close()
        upstream.terminate()
        upstream.wait(10)
        tmp.cleanup()


if __name__ == "__main__":
    main()
