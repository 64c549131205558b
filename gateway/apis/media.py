"""Images (issue 24): uploaded once by content, read back by sha256."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.files import file_download
from claw_kit.web.parsers import LimitedBodyParser
from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    IngestScope,
    ReadScope,
    principal_has_scope,
    read_sources_of,
    source_id_of,
)
from pool.errors import InvalidInput
from pool.media import MEDIA_TYPES, media_file, media_render, media_upload
from pool.models import Scope
from pool.selectors.media import media_get

from .. import serializers as s
from .common import _found


# --- media (issue 24): images stored once by content -------------------------------------------
class ImageBodyParser(LimitedBodyParser):
    """A raw image body (``Content-Type: image/png`` ...): its bytes, checked by the service."""

    media_type = "image/*"

    def decode(self, data: bytes):
        return data


class OctetStreamParser(ImageBodyParser):
    media_type = "application/octet-stream"  # the type is then read from the bytes


class MediaUploadApi(APIView):
    """POST /api/v1/media: store one image (PNG, JPEG, WebP or GIF), idempotent by content."""

    permission_classes = [IngestScope]
    parser_classes = [ImageBodyParser, OctetStreamParser, MultiPartParser]

    @extend_schema(
        request={"image/*": {"type": "string", "format": "binary"}, "multipart/form-data": None},
        responses={201: s.MediaSerializer},
        summary="Upload an image (raw body with its image/* type, or multipart field 'file')",
    )
    def post(self, request):
        data, declared, field = _upload_of(request)
        # 201 whether or not the bytes were stored already (by this source or another): the
        # answer must not tell what other sources hold (pool.media.media_upload).
        media = media_upload(data=data, declared_type=declared, source_id=source_id_of(request), field=field)
        return Response(media_render(media), status=status.HTTP_201_CREATED)


def _upload_of(request) -> tuple[bytes, str | None, str]:
    """(bytes, declared type, its field) of an upload: the raw body, or multipart's ``file`` part."""
    content_type = (request.content_type or "").split(";")[0].strip().lower()
    if content_type.startswith("multipart/"):
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidInput("multipart upload needs a 'file' part", field="file")
        declared = (upload.content_type or "").split(";")[0].strip() or None
        if declared == "application/octet-stream":
            declared = None
        return upload.read(), declared, "file"
    if not content_type:
        raise InvalidInput("send the image as the body with its Content-Type (image/png, ...)", field="body")
    data = request.data
    if not isinstance(data, bytes) or not data:
        raise InvalidInput("empty body; expected the image's bytes", field="body")
    return data, None if content_type == "application/octet-stream" else content_type, "body"


class MediaDetailApi(KnownQueryParams, APIView):
    """GET /api/v1/media/<sha256>: the image's bytes, as stored, with its checked type."""

    permission_classes = [ReadScope]

    def perform_content_negotiation(self, request, force=False):
        return super().perform_content_negotiation(request, force=True)  # bytes whatever Accept says

    @extend_schema(
        responses={(200, "image/*"): OpenApiResponse(description="the image's bytes")},
        summary="Download an image by its sha256 (immutable; ETag is the sha256)",
    )
    def get(self, request, sha256: str):
        sources = None if principal_has_scope(request.user, Scope.CONSUME) else read_sources_of(request)
        media = _found(media_get(sha256=sha256, sources=sources))
        etag = f'"{media.sha256}"'
        if etag in [t.strip() for t in request.META.get("HTTP_IF_NONE_MATCH", "").split(",")]:
            response = HttpResponse(status=304)
        else:
            response = file_download(request, media_file(media), content_type=media.media_type)
            response["Content-Length"] = str(media.byte_size)
        raster = media.media_type in MEDIA_TYPES.values()
        ext = media.media_type.split("/")[-1] if raster else "bin"
        disposition = "inline" if raster else "attachment"
        response["Content-Disposition"] = f'{disposition}; filename="{media.sha256}.{ext}"'
        response["X-Content-Type-Options"] = "nosniff"
        # Content-addressed, so never stale; private: it is served to authenticated callers only.
        response["Cache-Control"] = "private, max-age=31536000, immutable"
        response["ETag"] = etag
        return response
