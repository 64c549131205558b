"""bench.ingest: W-ingest through the HTTP API vs raw psycopg COPY of the same rows.

    python -m bench.ingest [--steps 20000] [--clients 4] [--workers 2]

W-ingest (shared/WORKLOADS.md): independent steps of 1,000 prompt + 200 response tokens,
200 float logprobs and a reward, 8 steps per trajectory, submitted in batches of 100 steps.
The API run goes through a real server process (uvicorn) over real HTTP (httpx) into the
database named by DATABASE_URL (a fresh database is created for the run), or SQLite when it
is unset. The baseline copies the same rows with raw psycopg binary COPY into a plain table
(bytea columns uncompressed, like the pool's) in the same server, once as a single COPY (the
reported `copy_steps_per_s` and `ratio`) and once committing per 100 rows like the API does.
Each round also submits the same steps as MessagePack with packed int32 arrays
(``claw_client.encode_step_batch``), reported as ``ratio_msgpack``; ``ratio`` is JSON.
Rounds alternate API and COPY so both see the same machine load; figures are medians.
``server_cpu_ms_per_batch`` (and ``_msgpack``): the server processes' CPU per batch of 100
steps (user + system, /proc), which other work on the machine disturbs less than the ratios.
Prints progress, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import orjson

from claw_client import MSGPACK, encode_step_batch
from tests.live import LiveServer, _with_db

BATCH = 100
PROMPT, RESPONSE, PER_TRAJ = 1_000, 200, 8


def w_ingest(n_steps: int, seed: int = 0, prefix: str = "wi") -> list[dict]:
    rng = random.Random(seed)
    steps = []
    for i in range(n_steps):
        traj, idx = divmod(i, PER_TRAJ)
        steps.append(
            {
                "uid": f"{prefix}-{i}",
                "trajectory_uid": f"{prefix}-t{traj}",
                "step_index": idx,
                "prompt_ids": [rng.randrange(150_000) for _ in range(PROMPT)],
                "response_ids": [rng.randrange(150_000) for _ in range(RESPONSE)],
                "rollout_logprobs": [-rng.random() * 10 for _ in range(RESPONSE)],
                "reward": rng.random(),
                "is_last": idx == PER_TRAJ - 1,
            }
        )
    return steps


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its descendants, alive now (Linux
    /proc; 0.0 elsewhere). uvicorn --workers runs the app in children of ``pid``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0.0
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(tree_cpu_s(int(c)) for c in children)


class ApiRunner:
    """A server process (own database) and a pool of HTTP client threads."""

    def __init__(self, tmp: Path, *, workers: int):
        # Production-like key cache (the test harness disables it to test revocation).
        self.server = LiveServer(tmp, {"CLAW_API_KEY_CACHE_SECONDS": "10"})
        self.server.extra_args = ["--workers", str(workers)] if workers > 1 else []
        self.server.start()
        self.db = "postgresql" if "DATABASE_URL" in self.server.env else "sqlite"
        self.cpu_ms_per_batch: float = 0.0  # the server's CPU per batch in the last run
        key = self.server.make_key("ingest", name="bench")
        self.headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        # Warm-up outside the timing: connections, imports, caches, the key.
        warm = orjson.dumps({"steps": w_ingest(16, seed=99, prefix="warm")})
        for _ in range(4):
            httpx.post(
                f"{self.server.url}/api/v1/steps", content=warm, headers=self.headers, timeout=60
            ).raise_for_status()

    def close(self) -> None:
        self.server.close()

    def run(self, steps: list[dict], *, clients: int, encoding: str = "json") -> float:
        if encoding == "json":
            bodies = [orjson.dumps({"steps": steps[i : i + BATCH]}) for i in range(0, len(steps), BATCH)]
            headers = self.headers
        else:  # MessagePack with packed int32/float64 arrays (claw_client.encode_step_batch)
            bodies = [encode_step_batch(steps[i : i + BATCH]) for i in range(0, len(steps), BATCH)]
            headers = dict(self.headers, **{"Content-Type": MSGPACK})
        queue = list(reversed(bodies))
        lock = threading.Lock()
        errors: list[str] = []

        def worker() -> None:
            with httpx.Client(base_url=self.server.url, headers=headers, timeout=120) as c:
                while True:
                    with lock:
                        if not queue:
                            return
                        body = queue.pop()
                    r = c.post("/api/v1/steps", content=body)
                    if r.status_code not in (200, 201):
                        errors.append(f"{r.status_code} {r.text[:200]}")
                        return

        assert self.server.proc is not None
        cpu0 = tree_cpu_s(self.server.proc.pid)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=worker) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        self.cpu_ms_per_batch = (tree_cpu_s(self.server.proc.pid) - cpu0) * 1000 / len(bodies)
        if errors:
            raise SystemExit(f"API errors: {errors[:3]}")
        return len(steps) / elapsed


def rows_of(steps: list[dict]) -> list[tuple]:
    return [
        (
            s["uid"],
            s["trajectory_uid"],
            s["step_index"],
            np.asarray(s["prompt_ids"], dtype="<i4").tobytes(),
            np.asarray(s["response_ids"], dtype="<i4").tobytes(),
            np.asarray(s["rollout_logprobs"], dtype="<f8").tobytes(),
            s["reward"],
        )
        for s in steps
    ]


DDL = """CREATE TABLE bench_copy (uid text PRIMARY KEY, trajectory_uid text NOT NULL, step_index integer NOT NULL,
         prompt_ids bytea NOT NULL, response_ids bytea NOT NULL, logprobs bytea, reward double precision)"""


class PgCopy:
    """Raw psycopg COPY into a plain table of the same rows, in its own database."""

    def __init__(self, url: str):
        import psycopg

        self.url = url
        self.name = f"claw_bench_copy_{os.getpid()}"
        self.admin = _with_db(url, "postgres")
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}"')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.conn = psycopg.connect(_with_db(url, self.name))

    def run(self, rows: list[tuple], *, batched: bool) -> float:
        conn = self.conn
        conn.execute("DROP TABLE IF EXISTS bench_copy")
        conn.execute(DDL)
        # The strongest raw baseline: no compression attempts on high-entropy blobs (as the
        # pool's own columns), binary COPY (no hex encoding of bytea).
        for col in ("prompt_ids", "response_ids", "logprobs"):
            conn.execute(f"ALTER TABLE bench_copy ALTER COLUMN {col} SET STORAGE EXTERNAL")
        conn.commit()
        t0 = time.perf_counter()
        chunks = [rows[i : i + BATCH] for i in range(0, len(rows), BATCH)] if batched else [rows]
        for chunk in chunks:
            with (
                conn.cursor() as cur,
                cur.copy(
                    "COPY bench_copy (uid, trajectory_uid, step_index, prompt_ids, response_ids, logprobs, reward) "
                    "FROM STDIN (FORMAT BINARY)"
                ) as cp,
            ):
                cp.set_types(["text", "text", "int4", "bytea", "bytea", "bytea", "float8"])
                for row in chunk:
                    cp.write_row(row)
            conn.commit()
        return len(rows) / (time.perf_counter() - t0)

    def close(self) -> None:
        import psycopg

        self.conn.close()
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


class SqliteCopy:
    """SQLite has no COPY: the raw baseline is executemany into a plain table (WAL mode)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.n = 0

    def run(self, rows: list[tuple], *, batched: bool) -> float:
        self.n += 1
        conn = sqlite3.connect(self.tmp / f"copy{self.n}.sqlite3")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(DDL.replace("bytea", "blob").replace("double precision", "real"))
        t0 = time.perf_counter()
        chunks = [rows[i : i + BATCH] for i in range(0, len(rows), BATCH)] if batched else [rows]
        for chunk in chunks:
            conn.executemany("INSERT INTO bench_copy VALUES (?,?,?,?,?,?,?)", chunk)
            conn.commit()
        conn.close()
        return len(rows) / (time.perf_counter() - t0)

    def close(self) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10_000, help="steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="server processes (uvicorn --workers)")
    args = p.parse_args()
    print(
        f"W-ingest: {args.steps} steps x {PROMPT + RESPONSE} tokens per round, batches of {BATCH}, "
        f"{args.rounds} rounds alternating API and COPY",
        file=sys.stderr,
    )
    url = os.environ.get("DATABASE_URL")
    api_rates, packed_rates, copy_rates, batched_rates = [], [], [], []
    api_cpu, packed_cpu = [], []
    with tempfile.TemporaryDirectory() as tmp:
        api = ApiRunner(Path(tmp), workers=args.workers)
        copy = PgCopy(url) if url else SqliteCopy(Path(tmp))
        try:
            for r in range(args.rounds):
                steps = w_ingest(args.steps, seed=r, prefix=f"r{r}")
                rows = rows_of(steps)
                api_rates.append(api.run(steps, clients=args.clients))
                api_cpu.append(api.cpu_ms_per_batch)
                packed = [
                    dict(s, uid=f"p{s['uid']}", trajectory_uid=f"p{s['trajectory_uid']}") for s in steps
                ]
                packed_rates.append(api.run(packed, clients=args.clients, encoding="msgpack"))
                packed_cpu.append(api.cpu_ms_per_batch)
                copy_rates.append(copy.run(rows, batched=False))
                batched_rates.append(copy.run(rows, batched=True))
                print(
                    f"  round {r}: api json {api_rates[-1]:,.0f} steps/s, api msgpack {packed_rates[-1]:,.0f} steps/s, "
                    f"copy {copy_rates[-1]:,.0f} steps/s (per-100 commits {batched_rates[-1]:,.0f})",
                    file=sys.stderr,
                )
        finally:
            api.close()
            copy.close()
    ratios = [a / c for a, c in zip(api_rates, copy_rates, strict=True)]
    packed_ratios = [a / c for a, c in zip(packed_rates, copy_rates, strict=True)]
    print(
        json.dumps(
            {
                "workload": "W-ingest",
                "db": api.db,
                "steps": args.steps * args.rounds,
                "rounds": args.rounds,
                "clients": args.clients,
                "server_workers": args.workers,
                "api_steps_per_s": round(statistics.median(api_rates), 1),
                "copy_steps_per_s": round(statistics.median(copy_rates), 1),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_per_round": [round(x, 3) for x in ratios],
                "api_msgpack_steps_per_s": round(statistics.median(packed_rates), 1),
                "ratio_msgpack": round(statistics.median(packed_ratios), 3),
                "copy_batched_steps_per_s": round(statistics.median(batched_rates), 1),
                # The server processes' CPU per batch of 100 (PostgreSQL's own not counted):
                # steadier than the ratios on a shared machine.
                "server_cpu_ms_per_batch": round(statistics.median(api_cpu), 1),
                "server_cpu_ms_per_batch_msgpack": round(statistics.median(packed_cpu), 1),
            }
        )
    )


if __name__ == "__main__":
    main()
