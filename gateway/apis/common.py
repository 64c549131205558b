"""What the API's views share: the scope a method needs, a 404 for a missing row, one or many."""

from __future__ import annotations

from django.http import Http404

from pool.access.auth import (
    IngestScope,
    ReadScope,
)


def _methods_scope(request, write=IngestScope, read=ReadScope):
    return [write()] if request.method not in ("GET", "HEAD", "OPTIONS") else [read()]


def _found(row):
    """``row``, or the API's 404 when a selector found none."""
    if row is None:
        raise Http404
    return row


def _one_or_many(data, key: str):
    """Accept ``{key: [...]}`` or a single object; returns (items, field prefix format)."""
    if isinstance(data, dict) and key in data:
        return data, True
    return {key: [data]}, False
