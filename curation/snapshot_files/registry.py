"""The files a snapshot is written as, in the order they are built: a new format is one module
(a base.SnapshotFile) and one line here."""

from __future__ import annotations

from .base import SnapshotFile
from .jsonl import JsonlFile
from .parquet import ParquetFile
from .tar import TarFile

FILES: tuple[type[SnapshotFile], ...] = (JsonlFile, ParquetFile, TarFile)
NAMES = tuple(f.name for f in FILES)
CONTENT_TYPES = {f.name: f.content_type for f in FILES}
