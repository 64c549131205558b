"""snapshot.jsonl: one JSON object per step, keys sorted, token arrays as lists; the sha256
of its lines is the snapshot's content hash."""

from __future__ import annotations

import hashlib
from typing import IO, Any

import orjson

from .base import Chunk


class JsonlFile:
    name = "jsonl"
    content_type = "application/x-ndjson"

    def __init__(self, tmp: IO[bytes]) -> None:
        self.tmp = tmp
        self.digest = hashlib.sha256()

    def add(self, chunk: Chunk) -> None:
        for row in chunk.rows:
            line = orjson.dumps(row, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
            self.tmp.write(line)
            self.digest.update(line)

    def finish(self, files: dict[str, IO[bytes]]) -> bool:
        return True

    def summary(self) -> dict[str, Any]:
        return {}
