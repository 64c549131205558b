"""bench.media: W-vision (shared/WORKLOADS.md) through the HTTP API: images stored once.

    python -m bench.media [--rounds 3] [--pulls 15]

W-vision: one prompt group of 8 rollouts x 10 turns (80 steps). Each turn adds a new 1280x800
RGB PNG screenshot drawn in code from a seeded rng (filled rectangles and text-like stripes on
a background, so it compresses like a real screen); rollouts start from the same first
screenshot and then each has its own (73 unique images). Each turn's prompt carries the text
history and the last 3 screenshots (216 image references in all), each image a run of 256
placeholder ids (151655, between vision start/end ids, as a VLM server expands it); the
response is 120 tokens. Steps are white-box, sent as JSON with their images base64 in
Claw-R1's ``multi_modal_data``, one batch per turn (the 8 rollouts' steps), to a real server
process (uvicorn) over real HTTP (httpx), into the database named by DATABASE_URL (a fresh
one) or SQLite.

Figures (final JSON line):

* ``stored_over_unique``: bytes the pool stored for images (the files under its media root)
  over the bytes of the unique images (target <= 1.02; no thumbnails or derived files exist);
* ``naive_over_unique``: per-step storage (every reference's bytes) over the same, for scale;
* ``ingest_ratio``: steps/s with images over steps/s of the same steps without them (the
  same ids, no ``multi_modal_data``), median over ``--rounds`` rounds, each with new images
  so that no round is served by an earlier round's dedup (target >= 0.5);
* ``pull_p50_ms``: a 64-step pull (format ``steps``, each row with its image references) by a
  fresh consumer, p50 over ``--pulls`` pulls.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from PIL import Image, ImageDraw

from tests.live import LiveServer

ROLLOUTS, TURNS, KEEP = 8, 10, 3
WIDTH, HEIGHT = 1280, 800
PAD, VISION_START, VISION_END, N_PAD = 151655, 151652, 151653, 256
RESPONSE, TURN_TEXT = 120, 48
TARGETS = {"stored_over_unique": 1.02, "ingest_ratio": 0.5}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pulls", type=int, default=15)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), rounds=args.rounds, pulls=args.pulls)
    print(json.dumps(result), flush=True)


# --- the workload ---------------------------------------------------------------------------
def screenshot(rng: random.Random) -> bytes:
    """A 1280x800 'screen': a background, a title bar, windows and lines of text-like stripes."""
    bg = tuple(rng.randrange(200, 256) for _ in range(3))
    image = Image.new("RGB", (WIDTH, HEIGHT), bg)
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, 0, WIDTH, 32), fill=tuple(rng.randrange(40, 90) for _ in range(3)))
    for _ in range(rng.randrange(3, 7)):
        x0, y0 = rng.randrange(0, WIDTH - 300), rng.randrange(40, HEIGHT - 200)
        x1, y1 = x0 + rng.randrange(200, 600), y0 + rng.randrange(120, 400)
        draw.rectangle(
            (x0, y0, x1, y1), fill=tuple(rng.randrange(230, 256) for _ in range(3)), outline=(90, 90, 90)
        )
        for y in range(y0 + 12, y1 - 10, 16):  # lines of "text": short dark runs
            x = x0 + 10
            while x < x1 - 40:
                w = rng.randrange(8, 60)
                draw.rectangle(
                    (x, y, min(x + w, x1 - 10), y + 7), fill=tuple(rng.randrange(0, 80) for _ in range(3))
                )
                x += w + rng.randrange(4, 12)
    # a photo-like region (an avatar, a picture in a page): noise that barely compresses
    x0, y0 = rng.randrange(40, WIDTH - 200), rng.randrange(60, HEIGHT - 140)
    image.paste(Image.frombytes("RGB", (160, 100), rng.randbytes(160 * 100 * 3)), (x0, y0))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def w_vision(seed: int, prefix: str) -> tuple[list[list[dict]], list[bytes], int]:
    """(batches of steps: one per turn, 8 steps each; the unique images; references).
    Each step's ``images`` (bytes, in order) are kept apart from the wire fields."""
    rng = random.Random(seed)
    first = screenshot(rng)
    shots = [[first] + [screenshot(rng) for _ in range(TURNS - 1)] for _ in range(ROLLOUTS)]
    unique = [first] + [s for rollout in shots for s in rollout[1:]]
    system = [rng.randrange(300, 150_000) for _ in range(64)]
    batches: list[list[dict]] = [[] for _ in range(TURNS)]
    refs = 0
    for r in range(ROLLOUTS):
        history = list(system)
        for t in range(TURNS):
            images = shots[r][max(0, t - KEEP + 1) : t + 1]
            refs += len(images)
            prompt = list(history)
            for _ in images:
                prompt += [VISION_START] + [PAD] * N_PAD + [VISION_END]
            prompt += [rng.randrange(300, 150_000) for _ in range(TURN_TEXT)]
            response = [rng.randrange(300, 150_000) for _ in range(RESPONSE)]
            batches[t].append(
                {
                    "uid": f"{prefix}-r{r}-t{t}",
                    "trajectory_uid": f"{prefix}-r{r}",
                    "prompt_group_uid": f"{prefix}-g",
                    "step_index": t,
                    "prompt_ids": prompt,
                    "response_ids": response,
                    "reward": float(rng.random() < 0.5) if t == TURNS - 1 else None,
                    "is_last": t == TURNS - 1,
                    "images": images,
                }
            )
            history += prompt[len(history) :][-TURN_TEXT:] + response  # the text history grows
    assert len(unique) == 1 + ROLLOUTS * (TURNS - 1) and refs == ROLLOUTS * (1 + 2 + KEEP * (TURNS - 2))
    return batches, unique, refs


def bodies(batches: list[list[dict]], *, with_images: bool, prefix: str) -> list[bytes]:
    out = []
    for batch in batches:
        steps = []
        for s in batch:
            wire = {k: v for k, v in s.items() if k != "images"}
            for k in ("uid", "trajectory_uid", "prompt_group_uid"):
                wire[k] = f"{prefix}{wire[k]}"
            if with_images:
                wire["multi_modal_data"] = {"images": [base64.b64encode(d).decode() for d in s["images"]]}
            steps.append(wire)
        out.append(orjson.dumps({"steps": steps}))
    return out


# --- the run ------------------------------------------------------------------------------------
def run(tmp: Path, *, rounds: int, pulls: int) -> dict:
    server = LiveServer(
        tmp, {"CLAW_API_KEY_CACHE_SECONDS": "10", "CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS": str(PAD)}
    )
    server.start()
    try:
        db = "postgresql" if "DATABASE_URL" in server.env else "sqlite"
        ingest = {"Authorization": f"Bearer {server.make_key('ingest', name='bench-agent')}"}
        # the same steps without images come from another source (the pull reads the agent's)
        plain_key = {"Authorization": f"Bearer {server.make_key('ingest', name='bench-plain')}"}
        admin = {"Authorization": f"Bearer {server.make_key('admin', name='bench-admin')}"}
        trainer = {"Authorization": f"Bearer {server.make_key('consume', name='bench-trainer')}"}
        with httpx.Client(base_url=server.url, timeout=300) as c:
            warm_batches, _, _ = w_vision(seed=999, prefix="warm")
            for body in bodies(warm_batches[:2], with_images=True, prefix="w-"):
                c.post(
                    "/api/v1/steps", content=body, headers={**ingest, "Content-Type": "application/json"}
                ).raise_for_status()
            media_root = tmp / "media" / "media"
            warm_bytes = _stored_bytes(media_root)
            with_rates, without_rates = [], []
            unique_bytes = naive_bytes = 0
            refs_total = unique_total = 0
            for rnd in range(rounds):
                batches, unique, refs = w_vision(seed=rnd, prefix=f"wv{rnd}")
                unique_bytes += sum(len(u) for u in unique)
                naive_bytes += sum(len(d) for b in batches for s in b for d in s["images"])
                refs_total, unique_total = refs_total + refs, unique_total + len(unique)
                plain = bodies(batches, with_images=False, prefix="plain-")
                images = bodies(batches, with_images=True, prefix="")
                print(
                    f"round {rnd}: {sum(len(b) for b in batches)} steps, {len(unique)} unique images "
                    f"({sum(len(u) for u in unique) / 1e6:.1f} MB), {refs} references, "
                    f"{sum(map(len, images)) / 1e6:.1f} MB of JSON",
                    file=sys.stderr,
                )
                without_rates.append(_post_all(c, plain, plain_key))
                with_rates.append(_post_all(c, images, ingest))
                print(
                    f"  steps/s without images {without_rates[-1]:.0f}, with {with_rates[-1]:.0f}",
                    file=sys.stderr,
                )
            stored = _stored_bytes(media_root) - warm_bytes
            pull_ms = _pulls(c, admin, trainer, pulls)
    finally:
        server.close()
    result = {
        "workload": "W-vision",
        "db": db,
        "rounds": rounds,
        "steps_per_round": ROLLOUTS * TURNS,
        "unique_images": unique_total,
        "image_references": refs_total,
        "unique_image_bytes": unique_bytes,
        "stored_image_bytes": stored,
        "stored_over_unique": round(stored / unique_bytes, 4),
        "naive_over_unique": round(naive_bytes / unique_bytes, 4),
        "steps_per_s_with_images": round(statistics.median(with_rates), 1),
        "steps_per_s_without_images": round(statistics.median(without_rates), 1),
        "ingest_ratio": round(
            statistics.median(w / wo for w, wo in zip(with_rates, without_rates, strict=True)), 3
        ),
        "pull_p50_ms": round(statistics.median(pull_ms), 2),
        "pull_p90_ms": round(sorted(pull_ms)[int(0.9 * (len(pull_ms) - 1))], 2),
    }
    result["targets"] = {
        f"stored_over_unique <= {TARGETS['stored_over_unique']}": result["stored_over_unique"]
        <= TARGETS["stored_over_unique"],
        f"ingest_ratio >= {TARGETS['ingest_ratio']}": result["ingest_ratio"] >= TARGETS["ingest_ratio"],
    }
    return result


def _post_all(c: httpx.Client, payloads: list[bytes], headers: dict[str, str]) -> float:
    """Steps/s of posting ``payloads`` in order (one client: the turns of a group arrive in order)."""
    n = sum(len(orjson.loads(p)["steps"]) for p in payloads)
    h = {**headers, "Content-Type": "application/json"}
    t = time.perf_counter()
    for p in payloads:
        r = c.post("/api/v1/steps", content=p, headers=h)
        if r.status_code != 201:
            raise SystemExit(f"API error {r.status_code}: {r.text[:300]}")
    return n / (time.perf_counter() - t)


def _stored_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.exists() else 0


def _pulls(c: httpx.Client, admin: dict[str, str], trainer: dict[str, str], n: int) -> list[float]:
    """Pulls of 64 image-carrying steps by fresh consumers of a dataset of the image steps."""
    spec = {"name": "vision", "filters": {"readiness": "any", "sources": ["bench-agent"]}}
    r = c.post("/api/v1/datasets", json=spec, headers=admin)
    r.raise_for_status()
    times = []
    for i in range(n + 2):
        t = time.perf_counter()
        r = c.post(
            f"/api/v1/consumers/vision-{i}/pull",
            json={"dataset": "vision", "batch_size": 64, "unit": "steps", "format": "steps"},
            headers=trainer,
        )
        dt = (time.perf_counter() - t) * 1000
        r.raise_for_status()
        rows = r.json()["batch"]["steps"]
        assert len(rows) == 64 and sum(len(s["images"]) for s in rows) > 64, len(rows)
        if i >= 2:  # warm-up pulls are not counted
            times.append(dt)
    return times


if __name__ == "__main__":
    main()
