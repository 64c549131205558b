"""File downloads that stream under both servers: a FileResponse whose body is read in chunks
by a synchronous iterator under WSGI and by an asynchronous one under ASGI.

Django's FileResponse iterates its file synchronously. Served by the ASGI handler (uvicorn,
`manage.py serve`), a synchronous body makes Django warn ("StreamingHttpResponse must consume
synchronous iterators in order to serve them asynchronously") and read the whole file into a
list in a worker thread before the first byte goes out: a snapshot of gigabytes held in
memory. Under ASGI the body here is an async generator that reads one chunk at a time in a
thread, so memory stays at one chunk and nothing warns; the headers (Content-Length,
Content-Disposition, Content-Type) are FileResponse's own either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import IO, Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, StreamingHttpResponse

CHUNK_BYTES = 1 << 20  # per read: the memory a download holds


def _served_by_asgi(request: Any) -> bool:
    """Whether ``request`` (Django's or DRF's wrapper of it) came through the ASGI handler."""
    return isinstance(getattr(request, "_request", request), ASGIRequest)


async def _chunks(file: IO[bytes], size: int) -> AsyncIterator[bytes]:
    read = sync_to_async(file.read, thread_sensitive=False)
    while chunk := await read(size):
        yield chunk


def file_download(request: Any, file: IO[bytes], **kwargs: Any) -> FileResponse:
    """A FileResponse of the open binary ``file`` (closed with the response); ``kwargs`` as
    FileResponse's (as_attachment, filename, content_type). Its body is an async iterator
    when ``request`` is served by ASGI."""
    response = FileResponse(file, **kwargs)
    if _served_by_asgi(request):
        # FileResponse has set the headers from the file and will close it; only the body
        # changes. A body without read() is taken as an iterator, async ones included.
        response.streaming_content = _chunks(file, CHUNK_BYTES)
    return response


def stream_download(
    request: Any, chunks: Iterator[bytes], *, content_type: str, filename: str | None = None
) -> StreamingHttpResponse:
    """A StreamingHttpResponse of ``chunks``, a synchronous iterator that may query the
    database (an export built as it goes). Under ASGI each chunk is taken in the request's
    sync thread (thread-sensitive, where its database connection lives), one at a time:
    memory stays at one chunk, as for ``file_download``. ``filename``: an attachment."""
    response = StreamingHttpResponse(chunks, content_type=content_type)
    if filename is not None:
        response["Content-Disposition"] = f'attachment; filename="{filename}"'
    if _served_by_asgi(request):
        response.streaming_content = _pulled(chunks)
    return response


async def _pulled(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    take = sync_to_async(_next, thread_sensitive=True)
    while (chunk := await take(chunks)) is not None:
        yield chunk


def _next(chunks: Iterator[bytes]) -> bytes | None:
    return next(chunks, None)
