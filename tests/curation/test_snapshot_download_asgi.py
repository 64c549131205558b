"""A snapshot download served by ASGI (uvicorn, `manage.py serve`) streams its file in chunks
through an async iterator: no "StreamingHttpResponse must consume synchronous iterators"
warning, and never the whole file in memory. Under WSGI (tests/curation/test_snapshots.py)
it stays Django's FileResponse as before."""

from __future__ import annotations

import warnings

import pytest
from asgiref.sync import async_to_sync
from django.core.files.storage import default_storage
from django.test import AsyncClient

from claw_kit.web import files
from pool.models import Scope
from tests.curation.test_snapshots import build, pool_with_labels  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_an_asgi_download_streams_the_file_in_async_chunks_without_a_warning(
    pool_with_labels,  # noqa: F811
    make_key,
    monkeypatch,
    fmt,
):
    # given a built snapshot, a reader's key and small chunks (so the file takes several)
    snap = build()
    key = make_key(Scope.CONSUME, name="asgi-trainer")
    monkeypatch.setattr(files, "CHUNK_BYTES", 1000)
    with default_storage.open(snap.files[fmt], "rb") as fh:
        stored = fh.read()
    assert len(stored) > 2000

    async def download():
        resp = await AsyncClient().get(
            f"/api/v1/snapshots/{snap.id}/download",
            {"format": fmt},
            headers={"Authorization": f"Bearer {key}"},
        )
        chunks = [chunk async for chunk in resp.streaming_content] if resp.streaming else []
        resp.close()
        return resp, chunks

    # when it is downloaded through Django's ASGI request path, any warning an error
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resp, chunks = async_to_sync(download)()
    # then the body was an async iterator of chunks of at most CHUNK_BYTES, the file as stored
    assert resp.status_code == 200 and resp.is_async
    assert len(chunks) > 1 and all(0 < len(c) <= 1000 for c in chunks)
    assert b"".join(chunks) == stored
    # and the headers are FileResponse's: length, name and type
    assert resp["Content-Length"] == str(len(stored))
    version = snap.dataset_version
    assert (
        f'filename="{version.dataset.name}-v{version.version}-{snap.id}.{fmt}"' in resp["Content-Disposition"]
    )
    assert resp["Content-Type"].startswith("application/")


def test_an_image_download_served_by_asgi_streams_without_a_warning(make_key, monkeypatch):
    # given a stored image and a consumer's key (consumers read every image a dataset serves)
    from pool.media import media_store
    from tests.media_support import png

    data = png(7, (400, 300))
    media = media_store(data=data, declared_type="image/png")
    key = make_key(Scope.CONSUME, name="asgi-images")
    monkeypatch.setattr(files, "CHUNK_BYTES", 500)

    async def download():
        resp = await AsyncClient().get(
            f"/api/v1/media/{media.sha256}", headers={"Authorization": f"Bearer {key}"}
        )
        chunks = [chunk async for chunk in resp.streaming_content]
        resp.close()
        return resp, chunks

    # when it is downloaded through Django's ASGI request path, any warning an error
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resp, chunks = async_to_sync(download)()
    # then the body came as async chunks, the image as stored
    assert resp.status_code == 200 and resp.is_async and len(chunks) > 1
    assert b"".join(chunks) == data and resp["Content-Length"] == str(len(data))
