"""Reads of stored images (issue 24): one image by its sha256, within what the caller may read."""

from __future__ import annotations

from ..models import Media, StepMedia
from ..tenancy import Sources


def media_get(*, sha256: str, sources: Sources) -> Media | None:
    """The stored image ``sha256``, or None when there is none or the caller may not see it.

    Tenancy, kept simple: an unrestricted caller (``sources`` None: read, consume and admin
    keys, staff sessions; trainers download what their pulls reference) reads any image; a
    restricted one (an ingest key) reads the images that steps of its sources reference. An
    image uploaded but not yet referenced by any of its steps answers 404 to it. Two queries
    at most (the image; the reference check, served by stepmedia_media)."""
    media = Media.objects.filter(sha256=sha256).first()
    if media is None or sources is None:
        return media
    seen = StepMedia.objects.filter(media_id=media.id, step__source_id__in=sorted(sources)).exists()
    return media if seen else None
