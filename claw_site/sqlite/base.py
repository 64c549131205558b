"""``ENGINE = "claw_site.sqlite"``: django.db.backends.sqlite3, plus the database file's folder
created when the first connection opens (settings only name the path; see settings.base),
and the file itself created readable by its owner only (0600, like the keys beside it in
var/: it holds every key's hash and every step)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.db.backends.sqlite3 import base


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        name = str(conn_params.get("database", ""))
        # In-memory databases (":memory:", "file:memorydb_...?mode=memory", the test database)
        # have no folder.
        if name and name != ":memory:" and not name.startswith("file:"):
            path = Path(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                # Created here, owner-only, before SQLite opens it (SQLite would use the
                # umask: 0644); its -wal and -shm files take the database file's mode.
                os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        return super().get_new_connection(conn_params)
