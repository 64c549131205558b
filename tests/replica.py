"""A real PostgreSQL streaming replica of the test server, for the tests of pool/replica.py.

``replica_of(url)`` copies the PostgreSQL server of ``url`` with ``pg_basebackup`` (a base
backup plus the WAL to make it consistent, ``-R``: it starts as a standby that streams from
that server) into a temporary data directory, starts it with ``pg_ctl`` on a free port and
yields that port; at the end it stops the replica and removes the directory. The primary is
only read from (a replication connection); nothing of its configuration changes. No
replication slot is made: a test that dies leaves nothing on the primary.

Needs the PostgreSQL server binaries of the primary's major version (pg_basebackup, pg_ctl;
Debian's postgresql-NN package puts them in /usr/lib/postgresql/NN/bin) and a pg_hba.conf
line on the primary letting this machine connect for replication, e.g.
``host replication all 127.0.0.1/32 trust`` (.ci/run adds that line to CI's server); without
them the tests skip and say which.
Run as root, the replica runs as the ``postgres`` user (the server refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.live import free_port


def server_bin(url: str) -> Path:
    """The folder of the server binaries matching the primary's major version."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10000
    for folder in (Path(f"/usr/lib/postgresql/{major}/bin"), Path(f"/usr/pgsql-{major}/bin")):
        if (folder / "pg_basebackup").exists() and (folder / "pg_ctl").exists():
            return folder
    found = shutil.which("pg_ctl")
    if found:
        version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
        if f" {major}." in version:
            return Path(found).parent
    pytest.skip(f"no PostgreSQL {major} server binaries (pg_basebackup, pg_ctl) to run a replica with")


@contextmanager
def replica_of(url: str) -> Iterator[int]:
    """A streaming replica of ``url``'s server on 127.0.0.1; yields its port."""
    bin_dir = server_bin(url)
    primary = urlparse(url)
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    base = Path(tempfile.mkdtemp(prefix="claw-replica-"))
    data, log = base / "data", base / "server.log"
    if as_postgres:
        shutil.chown(base, "postgres", "postgres")
    port = free_port()
    try:
        backup = subprocess.run(
            [
                *as_postgres,
                str(bin_dir / "pg_basebackup"),
                "-h",
                primary.hostname or "127.0.0.1",
                "-p",
                str(primary.port or 5432),
                "-U",
                primary.username or "postgres",
                "-D",
                str(data),
                "-X",
                "stream",  # the WAL written during the copy comes with it
                "-R",  # standby.signal and primary_conninfo: it starts as a streaming standby
                "-c",
                "fast",  # an immediate checkpoint, not a spread one
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if backup.returncode != 0:
            pytest.skip(
                "pg_basebackup from the test server failed (its pg_hba.conf must allow replication "
                f"connections from this machine): {backup.stderr.strip()[-500:]}"
            )
        # Our own configuration: the copy may hold the primary's (another port, other auth).
        (data / "postgresql.conf").write_text("hot_standby = on\nfsync = off\nshared_buffers = 32MB\n")
        (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        if as_postgres:
            for name in ("postgresql.conf", "pg_hba.conf"):
                shutil.chown(data / name, "postgres", "postgres")
        options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c hba_file={data / 'pg_hba.conf'}"
        started = subprocess.run(
            [
                *as_postgres,
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-w",
                "-t",
                "120",
                "-o",
                options,
                "start",
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert started.returncode == 0, (
            started.stdout + started.stderr + (log.read_text() if log.exists() else "")
        )
        yield port
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                timeout=120,
            )
        shutil.rmtree(base, ignore_errors=True)
