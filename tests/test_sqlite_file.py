"""The embedded database's file (claw_site/sqlite): created owner-only, like the keys."""

from __future__ import annotations

import stat

import pytest

from claw_site.sqlite.base import DatabaseWrapper

pytestmark = pytest.mark.backend_independent  # a SQLite file, whatever DATABASE_URL says


def test_the_sqlite_file_is_created_readable_by_its_owner_only(tmp_path):
    # given: a database file that does not exist yet, in a folder that does not either
    path = tmp_path / "var" / "claw.sqlite3"
    settings = {
        "ENGINE": "claw_site.sqlite",
        "NAME": str(path),
        "OPTIONS": {},
        "TIME_ZONE": None,
        "CONN_MAX_AGE": 0,
        "CONN_HEALTH_CHECKS": False,
        "AUTOCOMMIT": True,
        "ATOMIC_REQUESTS": False,
        "TEST": {},
        **{k: "" for k in ("USER", "PASSWORD", "HOST", "PORT")},
    }
    wrapper = DatabaseWrapper(settings, alias="file-mode")
    # when: the first connection opens it and writes
    conn = wrapper.get_new_connection(wrapper.get_connection_params())
    try:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    finally:
        conn.close()
    # then: the file is 0600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
