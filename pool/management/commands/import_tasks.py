"""manage.py import_tasks FILE [--set NAME] [--batch N]: register tasks from JSONL or Parquet.

Each row (a JSON object per line, or a Parquet row) has ``uid`` and optionally ``set``,
``prompt``, ``ground_truth`` and ``metadata``; ``--set`` names the set of rows without one.
Registered as shared tasks (no source: every source's groups may name them), in batches of
``--batch`` rows, each one transaction (pool.services.task_catalog.tasks_register:
idempotent by uid, so an interrupted import is simply run again). Prints progress.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pool.errors import PoolError
from pool.services.task_catalog import TaskIn, tasks_register

FIELDS = ("uid", "set", "prompt", "ground_truth", "metadata")


class Command(BaseCommand):
    help = "Register tasks from a JSONL or Parquet file (idempotent by uid)."

    def add_arguments(self, parser):
        parser.add_argument("file", type=Path)
        parser.add_argument("--set", dest="set_name", default=None, help="set of rows that name none")
        parser.add_argument("--batch", type=int, default=2_000, help="rows per transaction")

    def handle(self, *args: Any, file: Path, set_name: str | None, batch: int, **options: Any) -> None:
        if not file.exists():
            raise CommandError(f"{file} does not exist")
        rows = _parquet_rows(file) if file.suffix in (".parquet", ".pq") else _jsonl_rows(file)
        totals = {"created": 0, "updated": 0, "unchanged": 0}
        chunk: list[TaskIn] = []
        n = 0
        for n, row in enumerate(rows, start=1):
            chunk.append(_task_in(row, n, set_name))
            if len(chunk) >= batch:
                self._register(chunk, totals, n)
                chunk = []
        if chunk:
            self._register(chunk, totals, n)
        self.stdout.write(
            f"imported {n} rows: {totals['created']} created, {totals['updated']} updated, "
            f"{totals['unchanged']} unchanged"
        )

    def _register(self, chunk: list[TaskIn], totals: dict[str, int], upto: int) -> None:
        try:
            result = tasks_register(tasks=chunk, source_id=None, sources=None)
        except PoolError as e:
            raise CommandError(f"{e.field or 'row'}: {e}") from None
        totals["created"] += len(result.created)
        totals["updated"] += len(result.updated)
        totals["unchanged"] += len(result.unchanged)
        self.stdout.write(
            f"  {upto} rows: {totals['created']} created, {totals['updated']} updated, {totals['unchanged']} unchanged"
        )


def _task_in(row: Any, line: int, set_name: str | None) -> TaskIn:
    if not isinstance(row, dict):
        raise CommandError(f"row {line}: expected an object with uid")
    unknown = sorted(set(row) - set(FIELDS))
    if unknown:
        raise CommandError(f"row {line}: unknown field {unknown[0]!r}; known: {list(FIELDS)}")
    if not isinstance(row.get("uid"), str):
        raise CommandError(f"row {line}: uid must be a string")
    meta = row.get("metadata") or {}
    if not isinstance(meta, dict):
        raise CommandError(f"row {line}: metadata must be an object")
    return TaskIn(
        uid=row["uid"],
        set_name=row.get("set") if row.get("set") is not None else (set_name or ""),
        prompt=row.get("prompt"),
        ground_truth=row.get("ground_truth"),
        metadata=meta,
        field_prefix=f"row {line}: ",
    )


def _jsonl_rows(path: Path) -> Iterator[Any]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise CommandError(f"line {line_no}: not JSON ({e.msg})") from None


def _parquet_rows(path: Path) -> Iterator[dict]:
    import pyarrow.parquet as pq  # only for Parquet files

    for batch in pq.ParquetFile(path).iter_batches(batch_size=2_000):
        yield from batch.to_pylist()
