"""Compact submission of steps: MessagePack bodies with packed token arrays.

``POST /api/v1/steps`` accepts ``Content-Type: application/msgpack`` with the same fields as
JSON; token ids may be a bin of little-endian int32 and logprobs a bin of little-endian
float64. Arrays then travel as raw buffers (4 bytes per id instead of ~7 characters of JSON,
and no per-id parsing on either side)::

    body = encode_step_batch([{"trajectory_uid": "t", "step_index": 0,
                               "prompt_ids": np.array([...]), "response_ids": [...]}])
    httpx.post(f"{url}/api/v1/steps", content=body, headers={
        "Authorization": f"Bearer {key}", "Content-Type": MSGPACK})

Needs ``msgspec`` (and numpy); no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

MSGPACK = "application/msgpack"
_TOKEN_FIELDS = ("prompt_ids", "response_ids")


def pack_ids(ids: Any) -> bytes:
    """Token ids as little-endian int32 bytes (checked to lie in [0, 2**31))."""
    arr = np.asarray(ids)
    if arr.size and (arr.dtype.kind not in "iu" or int(arr.min()) < 0 or int(arr.max()) >= 2**31):
        raise ValueError("token ids must be integers in [0, 2**31)")
    return np.ascontiguousarray(arr, dtype="<i4").tobytes()


def pack_floats(values: Any) -> bytes:
    return np.ascontiguousarray(np.asarray(values, dtype=np.float64), dtype="<f8").tobytes()


def encode_step_batch(steps: Iterable[Mapping[str, Any]]) -> bytes:
    """A MessagePack body for ``POST /api/v1/steps`` with packed token arrays."""
    import msgspec

    out = []
    for step in steps:
        s = dict(step)
        for name in _TOKEN_FIELDS:
            s[name] = pack_ids(s[name])
        for name in ("rollout_logprobs", "token_rewards"):
            if s.get(name) is not None:
                s[name] = pack_floats(s[name])
        out.append(s)
    return msgspec.msgpack.encode({"steps": out})
