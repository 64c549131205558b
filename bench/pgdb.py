"""A fresh PostgreSQL database for one benchmark run, dropped at the end."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tests.live import _pg_admin, _with_db


@contextmanager
def fresh_database(bench: str) -> Iterator[None]:
    """Create ``claw_bench_<bench>_<hex>`` next to DATABASE_URL's database, point
    DATABASE_URL and the Django settings (test settings: DEBUG off, Celery not eager) at
    it for the block, then drop it. Exits with a message when DATABASE_URL is not
    PostgreSQL."""
    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith(("postgres://", "postgresql://")):
        raise SystemExit(f"bench.{bench} needs DATABASE_URL of a PostgreSQL server")
    name = f"claw_bench_{bench}_{uuid.uuid4().hex[:12]}"
    _pg_admin(base, f'CREATE DATABASE "{name}"')
    try:
        os.environ["DATABASE_URL"] = _with_db(base, name)
        os.environ["DJANGO_SETTINGS_MODULE"] = "claw_site.settings.test"
        os.environ.setdefault("CLAW_COMPILED_CHECK", "0")  # reads run as in production
        yield
    finally:
        from django.db import connections

        connections.close_all()
        os.environ["DATABASE_URL"] = base
        _pg_admin(base, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
