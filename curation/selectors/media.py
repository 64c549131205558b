"""Images on the pages (issue 24, part 5): a step's images for display, and the overview's
and optimization page's image counts and bytes saved by storing each image once."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Sum
from django.urls import reverse

from pool.models import Media, StepMedia


def step_media(step_id: int) -> list[dict[str, Any]]:
    """The images of step ``step_id`` in order, as templates/curation/_media_thumbs.html shows
    them: position, kind ("stored" or "url"), sha256, media_type, width, height, byte_size,
    message_index, part_index, token_start/token_end, and for a stored image ``thumb_url``
    (a small WebP, curation:media_thumb) and ``full_url`` (the image, curation:media_full).
    A remote image (never fetched) has ``source_url`` and no page URL: pages never load it.
    One query (served by stepmedia_step_pos_uniq)."""
    return steps_media([step_id]).get(step_id, [])


def steps_media(step_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """``step_media`` of several steps in one query (a trajectory's, a review item's);
    steps without images are absent."""
    out: dict[int, list[dict[str, Any]]] = {}
    if not step_ids:
        return out
    rows = (
        StepMedia.objects.filter(step_id__in=step_ids)
        .order_by("step_id", "position")
        .values(
            "step_id", "position", "kind", "source_url", "message_index", "part_index", "token_start",
            "token_end", "media__sha256", "media__media_type", "media__width", "media__height",
            "media__byte_size",
        )
    )  # fmt: skip
    for r in rows:
        sha = r["media__sha256"]
        out.setdefault(r["step_id"], []).append(
            {
                "position": r["position"],
                "kind": r["kind"],
                "sha256": sha,
                "media_type": r["media__media_type"],
                "width": r["media__width"],
                "height": r["media__height"],
                "byte_size": r["media__byte_size"],
                "message_index": r["message_index"],
                "part_index": r["part_index"],
                "token_start": r["token_start"],
                "token_end": r["token_end"],
                "source_url": r["source_url"],
                "thumb_url": reverse("curation:media_thumb", args=[sha]) if sha else None,
                "full_url": reverse("curation:media_full", args=[sha]) if sha else None,
            }
        )
    return out


def media_stats() -> dict[str, int]:
    """Images stored and what storing each once saves (templates/dashboard/_media_stats.html):

    * ``images``: distinct stored images; ``stored_bytes``: their bytes (each counted once;
      thumbnails and other derived files are not counted);
    * ``references``: stored-image references from steps; ``referenced_bytes``: the bytes
      per-step storage would hold (each reference's image size);
    * ``saved_bytes`` = referenced_bytes - stored_bytes (an image uploaded and not yet
      referenced counts as stored, so this can be negative for a moment);
    * ``remote``: references to remote images, passed through and never fetched.

    Two aggregate queries (a join of StepMedia to Media, and Media alone)."""
    refs = StepMedia.objects.filter(media__isnull=False).aggregate(n=Count("id"), b=Sum("media__byte_size"))
    stored = Media.objects.aggregate(n=Count("id"), b=Sum("byte_size"))
    remote = StepMedia.objects.filter(media__isnull=True).count()
    referenced = refs["b"] or 0
    stored_bytes = stored["b"] or 0
    return {
        "images": stored["n"],
        "stored_bytes": stored_bytes,
        "references": refs["n"],
        "referenced_bytes": referenced,
        "saved_bytes": referenced - stored_bytes,
        "remote": remote,
    }
