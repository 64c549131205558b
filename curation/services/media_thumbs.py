"""Thumbnails of stored images for the pages (issue 24, part 5).

A thumbnail is derived: a small WebP of a Media, made on first request and kept in the
default storage under ``thumbs/<sha[:2]>/<sha>-<size>.webp`` (not a Media row, so it never
counts in stored image bytes; deleting it only costs a rebuild). Idempotent: the same image
and size give the same file; two first requests at once both build it and the later save
replaces nothing (the name is checked first and a duplicate is dropped).
"""

from __future__ import annotations

import io
import warnings

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from PIL import Image

from pool.media import media_file
from pool.models import Media

# The longest side of a thumbnail, in pixels (the pages show them at up to 160 px; 2x for
# dense screens). WebP at quality 80: a 1280x800 screenshot gives about 5-15 KB.
THUMB_SIZE = 320
THUMB_TYPE = "image/webp"


def thumbnail_name(media: Media, size: int = THUMB_SIZE) -> str:
    return f"thumbs/{media.sha256[:2]}/{media.sha256}-{size}.webp"


def thumbnail_ensure(*, media: Media, size: int = THUMB_SIZE) -> bytes:
    """The WebP thumbnail's bytes of ``media``, built and stored if missing. Raises
    OSError/ValueError if the stored image no longer decodes (it was checked at ingest)."""
    name = thumbnail_name(media, size)
    if default_storage.exists(name):
        with default_storage.open(name, "rb") as fh:
            return fh.read()
    with media_file(media) as fh:
        data = _render(fh.read(), size)
    saved = default_storage.save(name, ContentFile(data))
    if saved != name:  # a concurrent request stored it first: keep theirs, drop ours
        default_storage.delete(saved)
    return data


def _render(data: bytes, size: int) -> bytes:
    limit = int(getattr(settings, "CLAW_MEDIA_MAX_PIXELS", Image.MAX_IMAGE_PIXELS or 89_478_485))
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > limit:
                raise ValueError(f"image of {image.width}x{image.height} pixels is over the limit")
            image.seek(0)  # an animated GIF: its first frame
            image.draft("RGB", (size, size))  # JPEG: decode at a reduced scale
            thumb = image.convert("RGBA" if image.mode in ("RGBA", "LA", "P") else "RGB")
    thumb.thumbnail((size, size))
    out = io.BytesIO()
    thumb.save(out, format="WEBP", quality=80, method=4)
    return out.getvalue()
