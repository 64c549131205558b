"""Images in steps, stored once by content (issue 24).

``media_store`` checks an image's bytes with Pillow and stores them under their sha256
(``media_store_many``: a whole write's images, in a constant number of queries; what the step
pipeline calls, pool/ingest/media.py); ``media_check`` runs the same checks without storing (a
proxied door, before its call goes upstream); ``media_resolve`` finds images already stored by
their sha256 among those the caller's sources hold (a white-box step's ``{"sha256": ...}``
reference, after ``POST /api/v1/media``); ``media_hold`` records which sources hold an image;
``media_decode_data_url`` and ``media_decode_base64`` turn what the doors carry into bytes.
Pillow's ``verify`` checks the file's structure and checksums without decoding its pixels.

Storage: Django's "default" storage (settings.STORAGES; the filesystem under MEDIA_ROOT unless
configured otherwise, an S3-compatible store by settings alone: see pool.models.Media), under
``media/<sha[:2]>/<sha>``. The file is written BEFORE the row, and the row is created in the
caller's transaction (the step write's), so a write that fails or crashes after the file leaves
at most an orphan file (harmless: the next store of the same bytes finds it and reuses it),
never a row without its file.

Limits (settings): CLAW_MEDIA_MAX_BYTES per image (20 MB), CLAW_MEDIA_MAX_PIXELS per image
(Pillow's decompression-bomb limit by default), CLAW_MEDIA_MAX_PER_STEP images per step.
Accepted types: PNG, JPEG, WebP, GIF (raster only; SVG is refused: it can carry script).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import re
import warnings
from collections.abc import Callable, Iterable, Mapping

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import transaction
from PIL import Image, UnidentifiedImageError

from .errors import InvalidInput, PoolError
from .models import Media, MediaSource
from .selectors.media import media_by_sha
from .tenancy import Sources

# Pillow's format name -> the media type we store and serve.
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_DATA_URL = re.compile(r"^data:([^;,]*)((?:;[^;,]*)*),", re.IGNORECASE)


class MediaTooLarge(PoolError):
    """An image over CLAW_MEDIA_MAX_BYTES."""

    status_code = 413
    code = "too_large"


def max_bytes() -> int:
    return int(getattr(settings, "CLAW_MEDIA_MAX_BYTES", 20 * 1024 * 1024))


def max_pixels() -> int:
    return int(getattr(settings, "CLAW_MEDIA_MAX_PIXELS", Image.MAX_IMAGE_PIXELS or 89_478_485))


def max_per_step() -> int:
    return int(getattr(settings, "CLAW_MEDIA_MAX_PER_STEP", 32))


def media_store(*, data: bytes, declared_type: str | None, field: str = "image") -> Media:
    """The Media of these bytes, stored if new. Idempotent: the same bytes give the same row
    (by sha256) and are written once. Raises InvalidInput / MediaTooLarge naming ``field``
    for bytes that are not a PNG, JPEG, WebP or GIF image, that are not the declared type,
    that are truncated, that declare more pixels than CLAW_MEDIA_MAX_PIXELS, or that are over
    CLAW_MEDIA_MAX_BYTES; nothing is written then. Call it inside the write's transaction.
    One image of ``media_store_many``."""
    _check_size(data, field)
    sha = hashlib.sha256(data).hexdigest()
    return media_store_many({sha: (data, declared_type, field)})[sha]


def _check_size(data: bytes, field: str) -> None:
    if len(data) > max_bytes():
        raise MediaTooLarge(
            f"image of {len(data)} bytes is over the limit of {max_bytes()} bytes", field=field
        )


def media_store_many(
    items: Mapping[str, tuple[bytes | Callable[[], bytes], str | None, str]],
) -> dict[str, Media]:
    """``media_store`` for many images at once (sha256 -> (bytes, or what gives them when
    they are needed: an image stored already is not decoded again; declared type; field)):
    one query finds those stored already, the new ones are checked, their files written, and
    their rows inserted in one statement (plus one query for their ids). Same errors, same
    guarantees (files before rows; call inside the write's transaction)."""
    if not items:
        return {}
    found = {m.sha256: m for m in Media.objects.filter(sha256__in=list(items))}
    new = []
    for sha, (payload, declared_type, field) in items.items():
        declared = normalize_media_type(declared_type, field=field)
        known = found.get(sha)
        if known is not None:
            if declared is not None and declared != known.media_type:
                raise InvalidInput(f"image is {known.media_type}, not the declared {declared}", field=field)
            continue
        data = payload() if callable(payload) else payload
        _check_size(data, field)
        media_type, width, height = _check_image(data, declared, field=field)
        new.append((sha, data, media_type, width, height))
    if new:
        rows = []
        for sha, data, media_type, width, height in new:
            name = _storage_name(sha)
            if not default_storage.exists(name):  # before the row (see the module docstring)
                name = default_storage.save(name, ContentFile(data))
            rows.append(
                Media(
                    sha256=sha,
                    media_type=media_type,
                    byte_size=len(data),
                    width=width,
                    height=height,
                    file=name,
                )
            )
        # ignore_conflicts: a concurrent writer storing the same bytes first keeps its row.
        Media.objects.bulk_create(rows, ignore_conflicts=True)
        found.update({m.sha256: m for m in Media.objects.filter(sha256__in=[r.sha256 for r in rows])})
    return found


def media_check(*, data: bytes, declared_type: str | None, field: str = "image") -> tuple[str, int, int]:
    """The checks of ``media_store`` without storing (a door's, before its call goes
    upstream): (media type, width, height), or the same errors. No query."""
    _check_size(data, field)
    return _check_image(data, normalize_media_type(declared_type, field=field), field=field)


def media_resolve(refs: Mapping[str, str], *, sources: Sources = None) -> dict[str, Media]:
    """The stored Media of each sha256 in ``refs`` (sha256 -> the field that named it) that
    ``sources`` may see (pool.selectors.media; None: any), in one query. Raises InvalidInput
    naming the field of a malformed sha256, or of one that is unknown OR held only by other
    sources, with the same message for both: a step references by hash only an image its
    sources already hold; other bytes must be sent (knowing a hash is not having the image)."""
    for sha, field in refs.items():
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise InvalidInput("sha256 must be 64 lowercase hex digits", field=field)
    found = media_by_sha(refs, sources=sources)
    for sha, field in refs.items():
        if sha not in found:
            raise InvalidInput(
                f"no stored image has sha256 {sha}; upload it first (POST /api/v1/media)", field=field
            )
    return found


def media_hold(*, media_ids: Iterable[int], source_id: int | None) -> None:
    """Record that ``source_id`` holds these images (pool.models.MediaSource), in one
    statement; nothing for an unrestricted writer without a source. Idempotent (a row held
    already, or inserted by a concurrent writer, is kept). Call inside the write's transaction."""
    ids = sorted(set(media_ids))
    if source_id is None or not ids:
        return
    MediaSource.objects.bulk_create(
        [MediaSource(media_id=i, source_id=source_id) for i in ids], ignore_conflicts=True
    )


def media_decode_data_url(url: str, *, field: str) -> tuple[bytes, str | None]:
    """``data:<type>;base64,<data>`` -> (bytes, declared type). Raises InvalidInput naming
    ``field`` for a data URL that is not base64 or does not decode."""
    text, declared = media_data_url_parts(url, field=field)
    return media_decode_base64(text, field=field), declared


def media_data_url_parts(url: str, *, field: str) -> tuple[str, str | None]:
    """``data:<type>;base64,<data>`` -> (its base64 text, declared type), not decoded."""
    match = _DATA_URL.match(url)
    if match is None:
        raise InvalidInput("image data URL must look like data:image/png;base64,...", field=field)
    if "base64" not in match.group(2).lower().split(";"):
        raise InvalidInput("image data URL must be base64-encoded", field=field)
    return url[match.end() :], match.group(1).strip() or None


def media_decode_base64(text: str, *, field: str) -> bytes:
    """Standard base64 (whitespace allowed) -> bytes; InvalidInput naming ``field`` otherwise.
    The encoded length is checked against CLAW_MEDIA_MAX_BYTES first, so a huge string is
    refused before it is decoded."""
    if not isinstance(text, str):
        raise InvalidInput("image data must be a base64 string", field=field)
    if len(text) * 3 // 4 > max_bytes() + 3:
        raise MediaTooLarge(f"image is over the limit of {max_bytes()} bytes", field=field)
    try:
        return base64.b64decode(text, validate=True)  # the common case: no copy of the text
    except (binascii.Error, ValueError):
        pass
    try:  # line-wrapped base64 (MIME style)
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput("image data is not valid base64", field=field) from None


def normalize_media_type(declared: str | None, *, field: str) -> str | None:
    if declared is None or declared == "":
        return None
    value = declared.strip().lower()
    value = _ALIASES.get(value, value)
    if "svg" in value:
        raise InvalidInput(
            "SVG images are not accepted (they can carry script); send PNG, JPEG, WebP or GIF", field=field
        )
    if value not in MEDIA_TYPES.values():
        raise InvalidInput(
            f"image type {declared!r} is not accepted; send PNG, JPEG, WebP or GIF", field=field
        )
    return value


def _check_image(data: bytes, declared: str | None, *, field: str) -> tuple[str, int, int]:
    head = data[:512].lstrip().lower()
    if head.startswith((b"<svg", b"<?xml", b"<!doctype svg")) or b"<svg" in head:
        raise InvalidInput(
            "SVG images are not accepted (they can carry script); send PNG, JPEG, WebP or GIF", field=field
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                fmt, (width, height) = image.format, image.size
                if width * height > max_pixels():
                    raise InvalidInput(
                        f"image of {width}x{height} pixels is over the limit of {max_pixels()} pixels",
                        field=field,
                    )
                image.verify()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidInput(f"image declares more than {max_pixels()} pixels", field=field) from None
    except UnidentifiedImageError:
        raise InvalidInput("bytes are not a PNG, JPEG, WebP or GIF image", field=field) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InvalidInput(f"image does not decode: {exc}", field=field) from None
    media_type = MEDIA_TYPES.get(fmt or "")
    if media_type is None:
        raise InvalidInput(f"image format {fmt} is not accepted; send PNG, JPEG, WebP or GIF", field=field)
    if declared is not None and declared != media_type:
        raise InvalidInput(f"image is {media_type}, not the declared {declared}", field=field)
    return media_type, width, height


def _storage_name(sha: str) -> str:
    return f"media/{sha[:2]}/{sha}"


def media_upload(
    *, data: bytes, declared_type: str | None, source_id: int | None, field: str = "body"
) -> Media:
    """POST /api/v1/media: ``media_store`` and ``media_hold`` for the uploader's source, in one
    transaction. Idempotent: the same bytes again answer the same image. The answer does not
    say whether the bytes were stored already (by this source or another): the door answers
    201 either way, so an upload is no oracle for what other sources hold."""
    with transaction.atomic():
        media = media_store(data=data, declared_type=declared_type, field=field)
        media_hold(media_ids=[media.id], source_id=source_id)
    return media


def media_render(media: Media) -> dict:
    """An upload's answer: what was stored, and where to download it."""
    return {
        "sha256": media.sha256,
        "media_type": media.media_type,
        "width": media.width,
        "height": media.height,
        "byte_size": media.byte_size,
        "url": f"/api/v1/media/{media.sha256}",
    }


def media_file(media: Media):
    """The stored bytes of ``media`` as an open binary file (the caller closes it)."""
    return default_storage.open(media.file.name, "rb")
