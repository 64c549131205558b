"""JSON rendering with orjson: numpy token arrays serialise natively, without a list per id."""

from __future__ import annotations

import orjson
from rest_framework.renderers import BaseRenderer

OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_UTC_Z


def dumps(data) -> bytes:
    try:
        return orjson.dumps(data, option=OPTIONS, default=_default)
    except orjson.JSONEncodeError:
        # orjson refuses integers beyond 64 bits; the stdlib writes any integer. (The write
        # paths reject such values, so this only guards data stored by other means.)
        import json

        return json.dumps(data, default=_stdlib_default, separators=(",", ":")).encode()


def _stdlib_default(obj):
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return _default(obj)


def _default(obj):
    if isinstance(obj, memoryview | bytes):
        return bytes(obj).hex()
    if hasattr(obj, "isoformat"):
        return obj.isoformat()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


class FastJSONRenderer(BaseRenderer):
    media_type = "application/json"
    format = "json"
    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if data is None:
            return b""
        return dumps(data)
