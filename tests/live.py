"""A real server process for end-to-end tests (real HTTP, real database, restartable).

The process runs `uvicorn claw_site.asgi:application` (or, with ``serve=True``, the
production entry `manage.py serve`, which configures uvicorn's logging itself) with the
local settings against its own database: a fresh PostgreSQL database when DATABASE_URL is set (CI's second run), else a
SQLite file in a temporary folder. Keys are minted through the real management command.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import os
import select
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import httpx

ROOT = Path(__file__).resolve().parent.parent


def listening_socket() -> socket.socket:
    """A TCP socket listening on 127.0.0.1, on a port the kernel picked (port 0).

    A server process started by the tests inherits it (``pass_fds``, uvicorn ``--fd``) rather
    than binding a port number picked earlier: between "this port is free" and the server's
    bind, any other process (another test run, an outgoing connection) could take it."""
    sock = socket.socket()
    # uvicorn wraps an inherited fd as AF_UNIX (socket.fromfd(fd, AF_UNIX, ...)), so asyncio
    # does not set TCP_NODELAY on the connections it accepts, and Nagle's algorithm with
    # delayed ACKs then stalls responses written in pieces (measured: a third of bench.ingest's
    # throughput). Accepted sockets inherit the option from the listening socket on Linux.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)  # uvicorn's own default backlog
    return sock


@contextmanager
def refused_port() -> Iterator[int]:
    """A port of 127.0.0.1 that refuses connections while the block runs: it is bound, so no
    other process can listen there, but not listening, so Linux answers every SYN with RST."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct ports that were free a moment ago. Only for a server that can only be
    given a port number (no inherited socket): it may find one taken, and its caller must
    then start it again on new ports (see tests/gateway/test_demo_traffic.py)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One port from free_ports() (same caveat)."""
    return free_ports(1)[0]


def stop_process(proc: subprocess.Popen, *, kill: bool = False, timeout: float = 20) -> None:
    """Stop ``proc`` (SIGTERM, or SIGKILL with ``kill``; SIGKILL after ``timeout``), reap it
    and close the log file it was given as stderr, if any."""
    if proc.poll() is None:
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr:
        proc.stderr.close()


def start_celery_worker(
    env: dict[str, str],
    queue: str,
    log: Path,
    *,
    pool: str = "solo",
    concurrency: int | None = None,
    new_session: bool = False,
) -> subprocess.Popen:
    """A Celery worker of the project on ``queue`` (give each test its own, through
    CLAW_CELERY_QUEUE, so no other run's worker takes its tasks), logging INFO to ``log``;
    ``new_session``: in its own process group (to kill it with its pool's children). Stop it
    with stop_process."""
    args = [sys.executable, "-m", "celery", "-A", "claw_site", "worker", "-Q", queue, "--pool", pool]
    if concurrency is not None:
        args += ["--concurrency", str(concurrency)]
    args += ["--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat"]
    with open(log, "ab") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=new_session
        )


def start_redis(port: int, log: Path) -> subprocess.Popen:
    """A private Redis on ``port`` (nothing kept on disk); returns once it answers PING."""
    proc = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        if ping.stdout.strip() == "PONG":
            return proc
        time.sleep(0.05)
    raise AssertionError(f"redis did not start: {log.read_text()}")


class LiveServer:
    def __init__(
        self,
        var_dir: Path,
        extra_env: dict[str, str] | None = None,
        *,
        app: str = "claw_site.asgi:application",
        serve: bool = False,
    ):
        self.app = app
        self.serve = serve
        self.var_dir = var_dir
        var_dir.mkdir(parents=True, exist_ok=True)  # on PostgreSQL no SQLite file creates it
        # Held for the server's whole life, restarts included: the port can never be lost.
        self._sock = listening_socket()
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self._db_name: str | None = None
        self._db_made = False  # created on first need: from the template, or empty to migrate
        self._env = self._make_env(extra_env or {})
        self.log_path = var_dir / f"server-{self.port}.log"
        self.extra_args: list[str] = []
        self._manager: _Manager | None = None

    # --- database ---------------------------------------------------------------------------
    def _make_env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(
            DJANGO_SETTINGS_MODULE="claw_site.settings.local",
            DJANGO_DEBUG="0",
            CLAW_VAR_DIR=str(self.var_dir),
            CLAW_DEMO="0",
            CLAW_API_KEY_CACHE_SECONDS="0",
            PYTHONUNBUFFERED="1",
            # Its own channel layer keys: no other process on this Redis (a bench's servers, a
            # server of another test) reaches its dashboards; its Celery workers take its env.
            CLAW_CHANNEL_PREFIX=f"claw-live-{uuid.uuid4().hex[:12]}",
        )
        base = os.environ.get("DATABASE_URL")
        if base:
            self._db_name = f"claw_live_{uuid.uuid4().hex[:12]}"
            env["DATABASE_URL"] = _with_db(base, self._db_name)
        env.update(extra)
        return env

    @property
    def env(self) -> dict[str, str]:
        """The server's environment. Its database exists once anyone reads it (a test running
        its own ``manage.py`` against it, say); before that it is made on first need."""
        self._ensure_db()
        return self._env

    @env.setter
    def env(self, value: dict[str, str]) -> None:
        self._env = value

    def _ensure_db(self, *, template: str | None = None) -> None:
        """Create the server's own PostgreSQL database once: a copy of ``template``, or empty.
        Made on first need, not up front: a database made empty and dropped again to copy the
        template cost a DROP DATABASE (a checkpoint) per server."""
        if self._db_name and not self._db_made:
            if self._env.get("DATABASE_URL") != _with_db(os.environ["DATABASE_URL"], self._db_name):
                return  # pointed at another database: nothing of ours to make
            copy = f' TEMPLATE "{template}"' if template else ""
            _pg_admin(os.environ["DATABASE_URL"], f'CREATE DATABASE "{self._db_name}"{copy}')
            self._db_made = True

    def _copy_migrated_template(self) -> bool:
        """Give the server a copy of the run's migrated template database (``_Template``)
        instead of running ``migrate`` (3 s of the 5 s a live server took to start; the suite
        starts dozens). The copy is the schema and data migrations' rows as ``migrate`` leaves them.
        False where the server's database is not the one this class made (a test that points
        DATABASE_URL elsewhere) or already exists: the caller then migrates."""
        url = self._env.get("DATABASE_URL", "")
        if self._db_name:
            if url != _with_db(os.environ["DATABASE_URL"], self._db_name) or self._db_made:
                return False
            self._ensure_db(template=_template().pg_name)
            return True
        target = Path(self._env["CLAW_VAR_DIR"]) / "claw.sqlite3"
        if url or target.exists():
            return False
        target.parent.mkdir(parents=True, exist_ok=True)
        with sqlite3.connect(_template().sqlite_path) as src, sqlite3.connect(target) as dst:
            src.backup(dst)  # consistent whatever the WAL holds, unlike a file copy
        return True

    def manage(self, *args: str) -> str:
        """Run ``manage.py ARGS`` against the server's database and settings; returns what it
        printed. Runs in one long-lived process per server (tests/live_manage.py), started on
        first use and again whenever ``env`` changed since."""
        self._ensure_db()
        if self._manager is None or self._manager.env != self.env:
            self._stop_manager()
            self._manager = _Manager(dict(self.env), self.log_path)
        ok, out, err = self._manager.run(list(args), timeout=300)
        if not ok:
            raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{out}\n{err}")
        return out

    def _stop_manager(self) -> None:
        if self._manager is not None:
            self._manager.close()
            self._manager = None

    def make_key(self, *scopes: str, name: str | None = None) -> str:
        args = ["create_api_key", "--name", name or f"live-{uuid.uuid4().hex[:8]}"]
        for s in scopes:
            args += ["--scope", s]
        return self.manage(*args).strip().splitlines()[-1]

    # --- process ----------------------------------------------------------------------------
    def start(self, *, migrate: bool = True) -> LiveServer:
        if migrate and not self._copy_migrated_template():
            self.manage("migrate", "--noinput", "-v", "0")
        self._ensure_db()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            self._command(),
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(self._sock.fileno(),),
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy:\n{self.log_path.read_text()}")

    def _command(self) -> list[str]:
        if self.serve:
            return [
                sys.executable,
                "manage.py",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--fd",
                str(self._sock.fileno()),
                *self.extra_args,
            ]
        return [
            sys.executable,
            "-m",
            "uvicorn",
            self.app,
            "--fd",
            str(self._sock.fileno()),
            "--log-level",
            "warning",
            "--lifespan",
            "off",
            "--no-access-log",
            *self.extra_args,
        ]

    def stop(self, *, kill: bool = False) -> None:
        if self.proc is not None:
            stop_process(self.proc, kill=kill)
            self.proc = None

    def restart(self, *, kill: bool = False) -> LiveServer:
        self.stop(kill=kill)
        return self.start(migrate=False)

    def close(self) -> None:
        self.stop()
        self._stop_manager()
        self._sock.close()
        if self._db_made:
            _pg_admin(os.environ["DATABASE_URL"], f'DROP DATABASE IF EXISTS "{self._db_name}" WITH (FORCE)')


@contextmanager
def live_server(
    var_dir: Path, extra_env: dict[str, str] | None = None, *, serve: bool = False
) -> Iterator[LiveServer]:
    server = LiveServer(var_dir, extra_env, serve=serve)
    try:
        yield server.start()
    finally:
        server.close()


class _Manager:
    """The process of tests/live_manage.py for one server environment: one JSON line per
    command each way."""

    def __init__(self, env: dict[str, str], log: Path):
        self.env = env
        with open(log, "ab") as err:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.live_manage"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self._buf = b""

    def run(self, argv: list[str], *, timeout: float) -> tuple[bool, str, str]:
        """(whether it succeeded, its stdout, its stderr with any traceback)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(argv).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.close()
                raise RuntimeError(f"manage.py {' '.join(argv)} did not finish within {timeout} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(
                    f"manage.py {' '.join(argv)}: the manage process died ({self.proc.wait()})"
                )
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        answer = json.loads(line)
        return answer["ok"], answer["out"], answer["err"]

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@dataclass
class _Template:
    """A migrated database that live servers copy instead of each running ``migrate``: a SQLite
    file, or a PostgreSQL database that copies are made from with CREATE DATABASE ... TEMPLATE
    (a file copy on the server: 0.1 s).

    Under `make test` one template per backend serves the whole run, every xdist worker and
    every bench the suite starts as a process: the run's controller names a folder
    (``SHARED_ENV``, tests/conftest.py) and drops what it holds at the end (``drop_shared``);
    the first process to need a template makes it there under a file lock, the others wait for
    it and copy. Elsewhere (a bench run by hand) each process makes its own and drops it at
    exit."""

    dir: Path
    pg_name: str | None

    @property
    def sqlite_path(self) -> Path:
        return self.dir / "claw.sqlite3"

    @classmethod
    def make(cls, folder: Path) -> _Template:
        """Migrate a new template in ``folder`` (SQLite) or in a new database on DATABASE_URL."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
        env.update(DJANGO_SETTINGS_MODULE="claw_site.settings.local", CLAW_VAR_DIR=str(folder))
        template = cls(folder, None)
        base = os.environ.get("DATABASE_URL")
        if base:
            template.pg_name = f"claw_tpl_{uuid.uuid4().hex[:12]}"
            _pg_admin(base, f'CREATE DATABASE "{template.pg_name}"')
            env["DATABASE_URL"] = _with_db(base, template.pg_name)
        out = subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if out.returncode != 0:
            template.drop()
            raise RuntimeError(f"migrating the live servers' template failed:\n{out.stdout}\n{out.stderr}")
        return template

    def drop(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.pg_name:
            _pg_admin(os.environ["DATABASE_URL"], f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')


# The folder of the run's shared templates (set by the run's controller, inherited by its workers
# and their processes).
SHARED_ENV = "CLAW_TEST_TEMPLATES"
_template_lock = threading.Lock()
_template_made: _Template | None = None


def _template() -> _Template:
    global _template_made
    with _template_lock:
        if _template_made is None:
            shared = os.environ.get(SHARED_ENV)
            if shared:
                _template_made = _shared_template(Path(shared))
            else:
                _template_made = _Template.make(Path(tempfile.mkdtemp(prefix="claw-live-template-")))
                atexit.register(_template_made.drop)
        return _template_made


def _shared_template(root: Path) -> _Template:
    """The run's template for this process's backend (its DATABASE_URL, or SQLite): made by the
    first process that asks, under an exclusive lock the others wait on."""
    backend = os.environ.get("DATABASE_URL") or "sqlite"
    key = hashlib.sha256(backend.encode()).hexdigest()[:12]
    folder, made = root / key, root / f"{key}.json"
    with open(root / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if made.exists():
            return _Template(folder, json.loads(made.read_text())["pg_name"])
        folder.mkdir(exist_ok=True)
        template = _Template.make(folder)
        # "x": a second maker (were the lock ever lost) fails here instead of replacing the first
        with made.open("x") as f:
            json.dump({"pg_name": template.pg_name, "database_url": backend, "pid": os.getpid()}, f)
        return template


def drop_shared(root: Path) -> None:
    """Drop the run's shared templates (the controller, at the run's end). A template on a
    server that a test started and has stopped since went with it."""
    import psycopg

    for made in root.glob("*.json"):
        spec = json.loads(made.read_text())
        if spec["pg_name"]:
            try:
                _pg_admin(spec["database_url"], f'DROP DATABASE IF EXISTS "{spec["pg_name"]}" WITH (FORCE)')
            except psycopg.OperationalError:
                pass
    shutil.rmtree(root, ignore_errors=True)


def _with_db(url: str, name: str) -> str:
    parts = urlparse(url)
    return urlunparse(parts._replace(path=f"/{name}"))


def _pg_admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(_with_db(url, "postgres"), autocommit=True) as conn:
        conn.execute(sql)
