"""bench.proxy: the OpenAI gateway against the same upstream called directly, in one run.

    python -m bench.proxy [--c1-requests 300] [--c32-seconds 10] [--prompt-chars 2400]

Workload: OpenAI-style chat completions (a system and a user message, ~2.4k prompt tokens
with the demo's byte-level toy tokenizer, 12-40 answer tokens), each request with a distinct
prompt and no trajectory header, so every call through the gateway opens a trajectory and
records one step with the upstream's exact ids. The demo upstream (claw_site/demo/upstream.py)
runs with zero latency; the gateway is one uvicorn process on the database named by
DATABASE_URL (a fresh PostgreSQL database is created and migrated for the run), or SQLite
when it is unset.

Measured in one run, alternating direct and gateway blocks so drift in the machine's load
hits both alike:
* concurrency 1: latency p50/p99 of each, after a warm-up; added = gateway - direct; and
  the gateway's own account of its calls, the p50 of each metric of its answers'
  ``Server-Timing`` (``c1_server_upstream_p50_ms``, ``c1_server_record_p50_ms``,
  ``c1_server_total_p50_ms``, and ``c1_server_own_p50_ms``, total less upstream per call):
  what the added latency is made of;
* concurrency 32: throughput (requests/s) over a fixed duration;
* the baseline: a bare relay (``relay_app`` below: raw ASGI under the same uvicorn, the
  body sent upstream as is through the gateway's transport, the answer returned as is; no
  Django, no parsing, no recording; its requests carry the fields the gateway adds, so the
  upstream answers the same bytes) takes the same c=32 block after the gateway's: its CPU
  per call is ``c32_relay_cpu_ms_per_call`` and ``gateway_over_relay_cpu`` the gateway's over
  it (what recording, auth and the field rules cost over forwarding alone);
* concurrency 32 through the production entry point (``manage.py serve``) with CLAW_WORKERS=1
  and 2, alternating (``c32_gateway_rps_workers_1``/``_2``): how the app scales with processes
  on this machine (skip with ``--no-workers-scaling``).

The other doors run the same workload in the same alternation: each chat request is also
sent as the Anthropic Messages request (``system`` + one user message, ``max_tokens``) and the
Responses request (``instructions`` + ``input``, ``max_output_tokens``) that translate to it,
so the upstream does the same work; ``c1_added_p50_ms_messages`` and
``c1_added_p50_ms_responses`` are their p50 minus the direct chat p50.

Logprobs: the gateway asks the upstream for the sampled tokens' logprobs on every call
(CLAW_UPSTREAM_LOGPROBS, on by default), which makes the upstream's answers larger and the
gateway parse and store more. A second gateway process with CLAW_UPSTREAM_LOGPROBS=0, before
the same upstream, joins the c=1 alternation: ``c1_added_p50_ms_logprobs_on`` and
``c1_added_p50_ms_logprobs_off`` are each gateway's chat p50 minus the direct p50.

The load client is a minimal keep-alive HTTP/1.1 client on asyncio (uvloop) that sends
prebuilt requests and reads Content-Length bodies, so that on a 2-core machine shared by
the upstream, the gateway, PostgreSQL and the client, the client costs as little as
possible. Prints progress lines, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from claw_kit.web import server_timing
from tests.live import ROOT, LiveServer, free_port

WARMUP = 100


# --- the baseline: a bare relay -----------------------------------------------------------------
_RELAY_UPSTREAM = os.environ.get("BENCH_RELAY_UPSTREAM", "")


async def relay_app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
    """A bare relay of POST /v1/chat/completions to BENCH_RELAY_UPSTREAM: the body as is,
    the answer as is, through the gateway's own transport (see the module docstring)."""
    if scope["type"] != "http":
        return
    chunks = []
    more = True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    from claw_kit.llm.transport import FastTransport

    global _relay_transport
    if _relay_transport is None:
        _relay_transport = FastTransport()
    req = httpx.Request(
        "POST",
        _RELAY_UPSTREAM + scope["path"],
        content=b"".join(chunks),
        headers={"content-type": "application/json", "accept-encoding": "identity"},
    )
    resp = await _relay_transport.handle_async_request(req)
    body = await resp.aread()
    await send(
        {
            "type": "http.response.start",
            "status": resp.status_code,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


_relay_transport = None


def start_relay(upstream_url: str) -> tuple[str, subprocess.Popen]:
    """The bare relay in its own uvicorn process; returns once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.proxy:relay_app",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--lifespan",
            "off",
            "--no-access-log",
        ],
        cwd=ROOT,
        env={**os.environ, "BENCH_RELAY_UPSTREAM": upstream_url},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.post(f"{url}/v1/chat/completions", content=b"{}", timeout=1)
            return url, proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the relay did not start")


# --- load client ----------------------------------------------------------------------------------
class RawClient:
    """One keep-alive HTTP/1.1 connection; requests are sent one at a time."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.timing: bytes = b""  # the last answer's Server-Timing header (the gateway's)

    async def post(self, path: str, body: bytes, headers: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nhost: "
            + self.host.encode()
            + b"\r\n"
            + headers
            + b"content-type: application/json\r\ncontent-length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = None
        self.timing = b""
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"server-timing":
                self.timing = value.strip()
        if length is None:
            raise RuntimeError(f"response without content-length: {head[:200]!r}")
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Target:
    def __init__(self, name: str, url: str, path: str, headers: dict[str, str]):
        self.name = name
        u = httpx.URL(url)
        self.host, self.port, self.path = u.host, u.port or 80, path
        self.headers = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())


def make_bodies(n: int, prompt_chars: int, seed: int) -> list[bytes]:
    """Distinct chat requests with a ``prompt_chars``-character prompt (system + user)."""
    rng = random.Random(seed)
    words = [
        "agent",
        "tool",
        "reads",
        "file",
        "writes",
        "tests",
        "policy",
        "reward",
        "token",
        "step",
        "the",
        "a",
    ]
    system_len = prompt_chars * 3 // 4
    out = []
    for i in range(n):

        def text(k: int) -> str:
            parts, size = [], 0
            while size < k:
                w = words[rng.randrange(len(words))]
                parts.append(w)
                size += len(w) + 1
            return " ".join(parts)[:k]

        system = text(system_len)
        user = f"task {i}: " + text(prompt_chars - system_len - 12)
        out.append(
            orjson.dumps(
                {
                    "model": "claw-demo",
                    "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                    "max_tokens": 64,
                    "temperature": 1.0,
                }
            )
        )
    return out


def door_body(chat: bytes, door: str) -> bytes:
    """The Messages or Responses request that translates to the chat request ``chat``."""
    body = orjson.loads(chat)
    system, user = (m["content"] for m in body["messages"])
    common = {"model": body["model"], "temperature": body["temperature"]}
    if door == "messages":
        return orjson.dumps(
            {
                **common,
                "max_tokens": body["max_tokens"],
                "system": system,
                "messages": [{"role": "user", "content": user}],
            }
        )
    return orjson.dumps(
        {**common, "max_output_tokens": body["max_tokens"], "instructions": system, "input": user}
    )


def relay_body(chat: bytes) -> bytes:
    """The chat request as the gateway sends it upstream (ids and logprobs asked), so the
    relay's upstream does the same work and answers the same bytes."""
    body = orjson.loads(chat)
    body.update(return_token_ids=True, logprobs=True, top_logprobs=0)
    return orjson.dumps(body)


async def run_c1(
    target: Target, bodies: list[bytes], timings: dict[str, list[float]] | None = None
) -> list[float]:
    """Latencies in ms; with ``timings``, each answer's Server-Timing metrics appended to it
    (the gateway's own account of the call: upstream, record, total)."""
    client = RawClient(target.host, target.port)
    lat = []
    try:
        for body in bodies:
            t0 = time.perf_counter()
            status, data = await client.post(target.path, body, target.headers)
            lat.append((time.perf_counter() - t0) * 1000)
            if status != 200:
                raise RuntimeError(f"{target.name}: HTTP {status}: {data[:300]!r}")
            if timings is not None:
                metrics = server_timing.parse(client.timing.decode())
                metrics["own"] = metrics["total"] - metrics["upstream"]  # what the gateway added
                for name, dur in metrics.items():
                    timings.setdefault(name, []).append(dur)
    finally:
        client.close()
    return lat


async def run_concurrent(
    target: Target, bodies: list[bytes], concurrency: int, seconds: float
) -> tuple[int, float]:
    deadline = time.perf_counter() + seconds
    count = 0
    it = iter(range(10**12))

    async def worker() -> None:
        nonlocal count
        client = RawClient(target.host, target.port)
        try:
            while time.perf_counter() < deadline:
                body = bodies[next(it) % len(bodies)]
                status, data = await client.post(target.path, body, target.headers)
                if status != 200:
                    raise RuntimeError(f"{target.name}: HTTP {status}: {data[:300]!r}")
                count += 1
        finally:
            client.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count, time.perf_counter() - t0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pg_commit_ms(database_url: str, n: int = 200) -> float:
    """p50 of a one-row INSERT committed on its own, on the bench's database: the floor a
    durable per-call commit puts under the gateway's added latency (the WAL flush)."""
    import psycopg

    with psycopg.connect(database_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_commit (v int)")  # a logged table: temp tables skip the WAL
        try:
            times = []
            for i in range(n):
                t0 = time.perf_counter()
                conn.execute("INSERT INTO bench_commit VALUES (%s)", [i])
                times.append((time.perf_counter() - t0) * 1000)
        finally:
            conn.execute("DROP TABLE bench_commit")
    return round(statistics.median(times), 3)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


# --- processes --------------------------------------------------------------------------------------
def start_upstream(latency_ms: float = 0.0) -> tuple[str, subprocess.Popen]:
    """The demo upstream (``latency_ms`` added to every answer); returns once it answers."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "claw_site.demo.upstream",
            "--port",
            str(port),
            "--latency-ms",
            str(latency_ms),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the demo upstream did not start")


def load_arguments(p: argparse.ArgumentParser, *, c1_requests: int, c32_seconds: float) -> None:
    """The load options every gateway benchmark takes (this one and bench.transport)."""
    p.add_argument("--c1-requests", type=int, default=c1_requests)
    p.add_argument("--c32-seconds", type=float, default=c32_seconds)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--prompt-chars", type=int, default=2400)


def install_uvloop() -> None:
    """The load client runs on uvloop, like the servers, so it is not the bottleneck."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    load_arguments(p, c1_requests=300, c32_seconds=10.0)
    p.add_argument("--rounds", type=int, default=2, help="alternating direct/gateway blocks per phase")
    p.add_argument(
        "--app",
        default="claw_site.asgi:application",
        help="ASGI app the gateway process serves (default: the project's, gateway paths on the lean handler)",
    )
    p.add_argument(
        "--no-workers-scaling",
        dest="workers_scaling",
        action="store_false",
        help="skip the c=32 phase comparing one and two app processes (manage.py serve, CLAW_WORKERS)",
    )
    args = p.parse_args(argv)
    install_uvloop()
    upstream_url, upstream = start_upstream()
    print(f"demo upstream at {upstream_url} (zero latency)", flush=True)
    relay_url, relay = start_relay(upstream_url)
    tmp = tempfile.TemporaryDirectory()
    common = {"CLAW_UPSTREAM_URL": f"{upstream_url}/v1", "CLAW_API_KEY_CACHE_SECONDS": "60"}
    server = LiveServer(Path(tmp.name), {**common, "CLAW_UPSTREAM_LOGPROBS": "1"}, app=args.app)
    off_server = LiveServer(
        Path(tmp.name) / "logprobs-off", {**common, "CLAW_UPSTREAM_LOGPROBS": "0"}, app=args.app
    )
    try:
        server.start()
        off_server.start()
        db = "postgresql" if server.env.get("DATABASE_URL") else "sqlite"
        key = server.make_key("ingest", "read", name="bench-proxy")
        print(f"gateway at {server.url} (1 uvicorn process serving {args.app}, {db})", flush=True)
        direct = Target("direct", upstream_url, "/v1/chat/completions", {})
        bare = Target("relay", relay_url, "/v1/chat/completions", {})
        gateway = Target("gateway", server.url, "/v1/chat/completions", {"authorization": f"Bearer {key}"})
        messages = Target("messages", server.url, "/v1/messages", {"x-api-key": key})
        responses = Target("responses", server.url, "/v1/responses", {"authorization": f"Bearer {key}"})
        off_key = off_server.make_key("ingest", "read", name="bench-proxy-logprobs-off")
        logprobs_off = Target(
            "logprobs_off", off_server.url, "/v1/chat/completions", {"authorization": f"Bearer {off_key}"}
        )
        n_c1 = args.c1_requests
        bodies = make_bodies(WARMUP * 5 + n_c1 * 5 + 4096, args.prompt_chars, seed=0)
        commit_ms = pg_commit_ms(server.env["DATABASE_URL"]) if db == "postgresql" else None
        if commit_ms is not None:
            print(f"PostgreSQL: a one-row INSERT + COMMIT takes {commit_ms:.2f} ms (p50) here", flush=True)
        assert server.proc is not None
        pids = {"gateway": server.proc.pid, "upstream": upstream.pid, "relay": relay.pid}
        result = asyncio.run(
            _measure(args, direct, gateway, bodies, n_c1, pids, [messages, responses], [logprobs_off], bare)
        )
        result["pg_commit_p50_ms"] = commit_ms
        if args.workers_scaling:
            result.update(_workers_scaling(args, upstream_url, bodies))
        stats = httpx.get(
            f"{server.url}/api/v1/stats", headers={"Authorization": f"Bearer {key}"}, timeout=60
        ).json()
        result.update(
            app=args.app,
            steps_recorded=stats["steps"],
            gateway_requests=result.pop("_gateway_requests"),
            db=db,
            workload=(
                f"chat completions, {args.prompt_chars}-char (~{args.prompt_chars}-token toy) prompts, "
                "distinct prompts, new trajectory per call, demo upstream zero latency; "
                "the same requests through /v1/messages and /v1/responses"
            ),
        )
        if result["steps_recorded"] != result["gateway_requests"]:
            print(
                f"WARNING: {result['gateway_requests']} gateway calls but {result['steps_recorded']} steps",
                flush=True,
            )
        print(json.dumps(result), flush=True)
    finally:
        server.close()
        off_server.close()
        for proc in (relay, upstream):
            proc.terminate()
            proc.wait(10)
        tmp.cleanup()


def _workers_scaling(args: argparse.Namespace, upstream_url: str, bodies: list[bytes]) -> dict:
    """c=32 throughput of the production entry point (``manage.py serve``) with CLAW_WORKERS=1
    and 2, in alternating rounds against the same upstream. Each server has its own database."""
    servers, targets = [], []
    tmp = tempfile.TemporaryDirectory()
    try:
        for n in (1, 2):
            srv = LiveServer(
                Path(tmp.name) / f"w{n}",
                {
                    "CLAW_UPSTREAM_URL": f"{upstream_url}/v1",
                    "CLAW_API_KEY_CACHE_SECONDS": "60",
                    "CLAW_WORKERS": str(n),
                },
                serve=True,
            )
            servers.append(srv)
            srv.start()
            key = srv.make_key("ingest", "read", name=f"bench-proxy-w{n}")
            targets.append(
                Target(f"workers_{n}", srv.url, "/v1/chat/completions", {"authorization": f"Bearer {key}"})
            )
        print("workers scaling: manage.py serve with CLAW_WORKERS=1 and 2", flush=True)

        async def measure() -> dict[str, float]:
            counts = {t.name: [0, 0.0] for t in targets}
            for t in targets:  # warm-up: every worker process gets connections and plans
                await run_concurrent(t, bodies, args.concurrency, 2.0)
            for r in range(args.rounds):
                for t in targets:
                    n, secs = await run_concurrent(
                        t, bodies, args.concurrency, args.c32_seconds / args.rounds
                    )
                    counts[t.name][0] += n
                    counts[t.name][1] += secs
                    print(
                        f"c={args.concurrency} round {r + 1}/{args.rounds} {t.name}: {n / secs:.0f} req/s",
                        flush=True,
                    )
            return {name: c[0] / c[1] for name, c in counts.items()}

        rps = asyncio.run(measure())
        return {
            "c32_gateway_rps_workers_1": round(rps["workers_1"], 1),
            "c32_gateway_rps_workers_2": round(rps["workers_2"], 1),
            "workers_2_over_1": round(rps["workers_2"] / rps["workers_1"], 3),
        }
    finally:
        for srv in servers:
            srv.close()
        tmp.cleanup()


async def _measure(
    args: argparse.Namespace,
    direct: Target,
    gateway: Target,
    bodies: list[bytes],
    n_c1: int,
    pids: dict[str, int],
    doors: list[Target],
    c1_only: list[Target],
    relay: Target,
) -> dict:
    """``c1_only``: other chat gateways, measured at c=1 only (their calls are not counted in
    ``_gateway_requests``, which the main gateway's stored steps are checked against)."""
    pos = 0
    chats = {"direct", "gateway", *(t.name for t in c1_only)}  # sent the chat bodies as they are

    def take(k: int, target: Target) -> list[bytes]:
        nonlocal pos
        out = bodies[pos : pos + k]
        pos += k
        if target is relay:
            return [relay_body(b) for b in out]
        return out if target.name in chats else [door_body(b, target.name) for b in out]

    targets = [direct, gateway, relay, *doors]
    # c=1 only: the gateways with and without logprobs back to back.
    c1_targets = [direct, gateway, *c1_only, *doors]
    gateway_requests = 0

    def counted(t: Target, n: int) -> int:
        return n if t in targets and t is not direct and t is not relay else 0

    # Warm-up: connections, imports, caches, the database's first plans.
    for t in [*c1_targets, relay]:
        await run_c1(t, take(WARMUP, t))
        gateway_requests += counted(t, WARMUP)
    print(f"warm-up done ({WARMUP} requests each)", flush=True)

    lat: dict[str, list[float]] = {t.name: [] for t in c1_targets}
    timings: dict[str, list[float]] = {}  # the main gateway's Server-Timing at c=1
    per_round = max(1, n_c1 // args.rounds)
    for r in range(args.rounds):
        for t in c1_targets:
            lat[t.name] += await run_c1(t, take(per_round, t), timings if t is gateway else None)
            print(
                f"c=1 round {r + 1}/{args.rounds} {t.name}: p50 {statistics.median(lat[t.name]):.2f} ms",
                flush=True,
            )
            gateway_requests += counted(t, per_round)

    rest = bodies[pos:]
    rest_of = {
        "direct": rest,
        "gateway": rest,
        "relay": [relay_body(b) for b in rest],
        **{t.name: [door_body(b, t.name) for b in rest] for t in doors},
    }
    counts = {t.name: [0, 0.0] for t in targets}
    cpu = {"gateway": 0.0, "upstream": 0.0, "relay": 0.0}
    for r in range(args.rounds):
        for t in targets:
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            n, secs = await run_concurrent(
                t, rest_of[t.name], args.concurrency, args.c32_seconds / args.rounds
            )
            counts[t.name][0] += n
            counts[t.name][1] += secs
            if t is not direct and t is not relay:
                gateway_requests += n
            if t is gateway:
                for name in ("gateway", "upstream"):
                    cpu[name] += cpu_seconds(pids[name]) - before[name]
            if t is relay:
                cpu["relay"] += cpu_seconds(pids["relay"]) - before["relay"]
            print(
                f"c={args.concurrency} round {r + 1}/{args.rounds} {t.name}: {n / secs:.0f} req/s", flush=True
            )

    d50, g50 = pct(lat["direct"], 0.5), pct(lat["gateway"], 0.5)
    d99, g99 = pct(lat["direct"], 0.99), pct(lat["gateway"], 0.99)
    d_rps = counts["direct"][0] / counts["direct"][1]
    g_rps = counts["gateway"][0] / counts["gateway"][1]
    return {
        "c1_added_p50_ms": round(g50 - d50, 3),
        "c1_added_p50_ms_logprobs_on": round(g50 - d50, 3),
        **{f"c1_added_p50_ms_{t.name}": round(pct(lat[t.name], 0.5) - d50, 3) for t in c1_only},
        "c1_added_p99_ms": round(g99 - d99, 3),
        # The gateway's own account at c=1 (its Server-Timing, p50 of each): the upstream call
        # as it saw it, the steps' record (build, write, commit), and request-in-hand to answer
        # ready; own = total - upstream, call by call. The client's added latency less own is
        # the HTTP transport and the upstream call's own overhead in the gateway.
        **{f"c1_server_{name}_p50_ms": round(pct(v, 0.5), 3) for name, v in sorted(timings.items())},
        "c32_direct_rps": round(d_rps, 1),
        "c32_gateway_rps": round(g_rps, 1),
        "c32_ratio": round(g_rps / d_rps, 3),
        "c1_direct_p50_ms": round(d50, 3),
        "c1_gateway_p50_ms": round(g50, 3),
        "c1_direct_p99_ms": round(d99, 3),
        "c1_gateway_p99_ms": round(g99, 3),
        "concurrency": args.concurrency,
        # CPU per call through the gateway at c=32 (process CPU time / calls): where the time goes.
        "c32_gateway_cpu_ms_per_call": round(cpu["gateway"] / counts["gateway"][0] * 1000, 3),
        "c32_upstream_cpu_ms_per_call": round(cpu["upstream"] / counts["gateway"][0] * 1000, 3),
        # The same call through the bare relay: what forwarding alone costs.
        "c32_relay_cpu_ms_per_call": round(cpu["relay"] / counts["relay"][0] * 1000, 3),
        "c32_relay_rps": round(counts["relay"][0] / counts["relay"][1], 1),
        "gateway_over_relay_cpu": round(
            (cpu["gateway"] / counts["gateway"][0]) / (cpu["relay"] / counts["relay"][0]), 3
        ),
        **{f"c1_added_p50_ms_{t.name}": round(pct(lat[t.name], 0.5) - d50, 3) for t in doors},
        **{f"c1_{t.name}_p50_ms": round(pct(lat[t.name], 0.5), 3) for t in doors},
        **{f"c32_{t.name}_rps": round(counts[t.name][0] / counts[t.name][1], 1) for t in doors},
        "_gateway_requests": gateway_requests,
        "cpus": os.cpu_count(),
    }


if __name__ == "__main__":
    main()
