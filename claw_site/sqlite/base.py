"""``ENGINE = "claw_site.sqlite"``: django.db.backends.sqlite3, plus the database file's folder
created when the first connection opens (settings only name the path; see settings.base)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        name = str(conn_params.get("database", ""))
        # In-memory databases (":memory:", "file:memorydb_...?mode=memory", the test database)
        # have no folder.
        if name and name != ":memory:" and not name.startswith("file:"):
            Path(name).parent.mkdir(parents=True, exist_ok=True)
        return super().get_new_connection(conn_params)
