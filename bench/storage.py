"""bench.storage: how many token bytes the pool stores for W-agentic.

    python -m bench.storage

Stores W-agentic (one GRPO group, 8 rollouts x 8 turns, shared/WORKLOADS.md) through the
HTTP API of a real server process (PostgreSQL when DATABASE_URL is set, else SQLite), turn
by turn across rollouts as agents would send them, then reads the pool's own accounting
(GET /api/v1/stats) and checks every step reads back exactly. Prints one JSON line:
stored token bytes, naive bytes (sum of step tokens x 4), unique tokens x 4, and the ratio
of stored to unique. Also reports the on-disk size of the step table where measurable.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx

from bench.workloads import W_AGENTIC_UNIQUE_TOKENS, w_agentic
from tests.live import LiveServer


def main() -> None:
    steps = w_agentic(groups=1)
    by_turn = sorted(steps, key=lambda s: (s.turn, s.rollout))
    payload = [
        {
            "uid": f"wa-r{s.rollout}-t{s.turn}",
            "trajectory_uid": f"wa-r{s.rollout}",
            "prompt_group_uid": "wa-g0",
            "step_index": s.turn,
            "prompt_ids": s.prompt,
            "response_ids": s.response,
            "is_last": s.turn == 7,
        }
        for s in by_turn
    ]
    with tempfile.TemporaryDirectory() as tmp:
        server = LiveServer(Path(tmp))
        try:
            server.start()
            key = server.make_key("ingest", "read", name="bench")
            h = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=server.url, headers=h, timeout=120) as c:
                for turn in range(8):  # one request per turn: the 8 rollouts' steps
                    batch = [p for p in payload if p["step_index"] == turn]
                    c.post("/api/v1/steps", json={"steps": batch}).raise_for_status()
                for p in payload:
                    got = c.get(f"/api/v1/steps/{p['uid']}").json()
                    if got["prompt_ids"] != p["prompt_ids"] or got["response_ids"] != p["response_ids"]:
                        raise SystemExit(f"step {p['uid']} did not read back exactly")
                stats = c.get("/api/v1/stats").json()["tokens"]
            db = "postgresql" if "DATABASE_URL" in server.env else "sqlite"
        finally:
            server.close()
    stored, naive = stats["stored_bytes"], stats["naive_bytes"]
    unique = W_AGENTIC_UNIQUE_TOKENS * 4
    print(
        f"W-agentic: {len(payload)} steps, {naive // 4:,} step tokens, {W_AGENTIC_UNIQUE_TOKENS:,} unique; "
        f"all steps read back exactly",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "workload": "W-agentic",
                "db": db,
                "stored_bytes": stored,
                "naive_bytes": naive,
                "unique_bytes": unique,
                "ratio_to_unique": round(stored / unique, 4),
                "ratio_to_naive": round(stored / naive, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
