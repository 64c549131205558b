"""Images for signed-in users: a stored image's thumbnail and the image itself, served inert."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse

from .access import allowed

# --- images (issue 24): thumbnails and full images for the pages -------------------------------
# Served with their checked raster type, nosniff, a filename and a sandboxing CSP, so a
# hostile file opened on its own (only PNG, JPEG, WebP and GIF pass ingest) is never active.
_MEDIA_CSP = "default-src 'none'; img-src 'self'; sandbox"


def _media_headers(response: HttpResponse, filename: str, *, inline: bool = True) -> HttpResponse:
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = f'{"inline" if inline else "attachment"}; filename="{filename}"'
    response["Content-Security-Policy"] = _MEDIA_CSP
    # Content-addressed: the same URL is the same bytes forever; private: signed-in users only.
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    return response


def _media_or_404(sha256: str):
    from pool.selectors.media import media_get

    media = media_get(sha256=sha256, sources=None) if len(sha256) == 64 else None
    if media is None:
        raise Http404("no such image")
    return media


@allowed("pool.view_step")
def media_thumb(request: HttpRequest, sha256: str) -> HttpResponse:
    """A stored image's small WebP (made on first request, then kept under thumbs/)."""
    from ..services.media_thumbs import THUMB_TYPE, thumbnail_ensure

    media = _media_or_404(sha256)
    return _media_headers(
        HttpResponse(thumbnail_ensure(media=media), content_type=THUMB_TYPE), f"{media.sha256}-thumb.webp"
    )


@allowed("pool.view_step")
def media_full(request: HttpRequest, sha256: str) -> HttpResponse:
    """A stored image as stored, with its checked type (a raster type; anything else would
    be served as a download)."""
    from claw_kit.web.files import file_download
    from pool.media import MEDIA_TYPES, media_file

    media = _media_or_404(sha256)
    raster = media.media_type in MEDIA_TYPES.values()
    ext = media.media_type.split("/")[-1] if raster else "bin"
    response = file_download(
        request, media_file(media), content_type=media.media_type if raster else "application/octet-stream"
    )
    response["Content-Length"] = str(media.byte_size)
    return _media_headers(response, f"{media.sha256}.{ext}", inline=raster)
