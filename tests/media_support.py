"""Images for the consumer-side media tests (issue 24): PNGs drawn from a seed, and a step's
image references created with the media service (the same rows the pipeline writes)."""

from __future__ import annotations

import hashlib
import io
import random

from PIL import Image, ImageDraw

from pool.media import media_store
from pool.models import Step, StepMedia


def png(seed: int, size: tuple[int, int] = (64, 40)) -> bytes:
    """A small PNG, different for each seed: a background and a few rectangles."""
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x0, y0 = rng.randrange(size[0] - 8), rng.randrange(size[1] - 8)
        colour = tuple(rng.randrange(256) for _ in range(3))
        draw.rectangle([x0, y0, x0 + rng.randrange(4, 30), y0 + rng.randrange(4, 20)], fill=colour)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def attach(step_uid: str, images: list[bytes], *, first_token: int | None = None, run: int = 4) -> None:
    """Store ``images`` (once by content) and reference them from the step, in order, each in
    message 0 part i (and a placeholder span of ``run`` tokens from ``first_token`` when given)."""
    step = Step.objects.get(uid=step_uid)
    rows = []
    for i, data in enumerate(images):
        media = media_store(data=data, declared_type="image/png")
        start = None if first_token is None else first_token + i * run
        rows.append(
            StepMedia(
                step=step,
                position=i,
                media=media,
                message_index=0,
                part_index=i,
                token_start=start,
                token_end=None if start is None else start + run,
            )
        )
    StepMedia.objects.bulk_create(rows)


def attach_url(step_uid: str, url: str, position: int) -> None:
    """A remote image reference (passed through, never fetched)."""
    StepMedia.objects.create(
        step=Step.objects.get(uid=step_uid), position=position, kind=StepMedia.Kind.URL, source_url=url
    )
