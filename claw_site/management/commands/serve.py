"""Serve the whole app: the ASGI server (HTTP API, gateway, pages, websockets) and, in demo
mode, the built-in demo upstream and demo traffic. `make run` calls this after migrate and
bootstrap.

Demo mode (CLAW_DEMO on, the default, and no CLAW_UPSTREAM_URL): the demo upstream
(claw_site.demo.upstream, answers like vLLM) runs as a child process and becomes the gateway's
upstream. serve binds its listening socket and hands it to the child (``--fd``), so no other
process can take the port in between: on CLAW_DEMO_UPSTREAM_PORT when set (taken: serve stops
with one line naming the port and the setting), else on PORT+1, or on a port the kernel picks
when PORT+1 is taken; once the app answers /healthz, demo agents
(claw_site.demo.traffic) run in a daemon thread with the API key "demo-agent", whose clear key is
kept in var/demo-agent.key (mode 0600) so restarts reuse it. CLAW_DEMO=0 turns both off.
SIGINT (Ctrl-C) and SIGTERM stop serve cleanly: uvicorn shuts down, the child is terminated
and waited for, and serve exits 0 (the kernel terminates the child too if serve dies).

Production (claw_site.settings.production): CLAW_DEMO is off, so nothing of the demo starts;
without CLAW_UPSTREAM_URL serve still runs (API, pages, admin) and logs that the gateway has no
upstream. In embedded mode (no REDIS_URL) it logs that Celery tasks run eagerly in-process.

Periodic work: in embedded mode (no REDIS_URL, so no celery beat) serve runs celery beat's
schedule itself: every entry of settings.CELERY_BEAT_SCHEDULE, its task looked up by name
and called in-process at the entry's interval (``beat_schedule``, ``sweep_forever``), in a
daemon thread that logs and survives errors and is stopped and joined on exit. With
REDIS_URL set, run ``celery -A claw_site beat`` next to the workers; serve then runs none of
it, so two schedulers never race.

Its environment (HOST, PORT, CLAW_WORKERS, CLAW_DEMO_UPSTREAM_PORT, CLAW_DEMO_PACE_S,
CLAW_UVICORN_LOG_LEVEL, and the slow-client guards CLAW_HEADER_TIMEOUT_S, CLAW_BODY_TIMEOUT_S,
CLAW_BODY_MIN_BYTES_PER_S and CLAW_MAX_CONNECTIONS_PER_IP of claw_kit/web/slow_clients.py) is
read by the settings, through their strict env helpers (claw_site/settings/base.py, section
"serve").
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connections

from claw_kit.metrics import multiprocess_dir
from claw_site.celery import app as celery_app
from claw_site.demo.traffic import run_demo_traffic
from claw_site.demo.upstream import DEMO_IMAGE_TOKENS
from pool.management.commands.bootstrap import stored_key
from pool.models import Scope

log = logging.getLogger(__name__)

DEMO_KEY_NAME = "demo-agent"
DEMO_KEY_FILE = "demo-agent.key"
STARTUP_TIMEOUT_S = 60.0
STARTUP_FAILURE = 3  # uvicorn's exit status when it cannot serve (uvicorn.main.STARTUP_FAILURE)
# How long exit waits for a sweep in progress (each one is bounded, pool/services/readiness.py).
SWEEP_JOIN_TIMEOUT_S = 10.0
# uvicorn's httptools protocol with the slow-client guards (an import string: workers import it).
GUARDED_HTTP = "claw_kit.web.slow_clients:GuardedHttpProtocol"


class Command(BaseCommand):
    help = "Serve Claw-R1 on 127.0.0.1:$PORT (default 8000); in demo mode also the demo upstream and agents."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=settings.CLAW_SERVE_HOST)
        parser.add_argument("--port", type=int, default=settings.CLAW_SERVE_PORT)
        parser.add_argument("--workers", type=int, default=settings.CLAW_SERVE_WORKERS)
        parser.add_argument(
            "--fd",
            type=int,
            default=None,
            help="serve on this inherited listening socket (socket activation, tests) instead of binding --port",
        )

    def handle(self, *args: Any, host: str, port: int, workers: int, fd: int | None, **options: Any) -> None:
        demo = bool(settings.CLAW_DEMO) and not settings.CLAW_UPSTREAM_URL
        if not demo and not settings.CLAW_UPSTREAM_URL:
            log.warning(
                "No CLAW_UPSTREAM_URL and the demo is off: the OpenAI-compatible gateway (/v1/, /t/) "
                "answers 502 not_configured; the REST API, pages and admin work as usual"
            )
        _prepare_multiprocess_metrics()
        children: list[subprocess.Popen] = []
        threads: list[threading.Thread] = []
        stop = threading.Event()
        # uvicorn re-raises a captured SIGINT or SIGTERM after its graceful shutdown (and one may
        # come before it runs); either ends up here as _Stopped, so the `finally` below reaps the
        # children and serve returns normally: exit 0, not 130 or 143.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _raise_stopped)
        try:
            if demo:
                children.append(self._start_demo_upstream(_demo_upstream_socket(port)))
                key = _demo_key()
                connections.close_all()  # the server and the traffic thread open their own
                local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
                pace = settings.CLAW_DEMO_PACE_S
                threading.Thread(
                    target=self._demo_traffic,
                    args=(f"http://{local}:{port}", key, stop, pace),
                    name="claw-demo-traffic",
                    daemon=True,
                ).start()
            if not settings.REDIS_URL:
                schedule = beat_schedule()
                connections.close_all()  # the sweep thread opens its own
                sweeper = threading.Thread(
                    target=sweep_forever, args=(stop, schedule), name="claw-sweep", daemon=True
                )
                sweeper.start()
                threads.append(sweeper)
                every = ", ".join(f"{p.task} every {p.every_s:g} s" for p in schedule)
                self.stdout.write(
                    f"Readiness sweep in-process every {settings.CLAW_SWEEP_SECONDS:g} s, with the rest of "
                    f"celery beat's schedule (no REDIS_URL: no celery beat): {every}"
                )
            if settings.CELERY_TASK_ALWAYS_EAGER:
                # A note, not a warning: this is what `make run` is meant to do (the quiet first
                # hour: startup prints no warning the user did not cause).
                self.stdout.write(
                    "Embedded mode (no REDIS_URL): Celery tasks run eagerly inside this process at "
                    "enqueue time; set REDIS_URL and run `celery -A claw_site worker` to move them out"
                )
            if fd is not None:
                _no_delay(fd)
            self.stdout.write(
                f"Claw-R1 listening on http://{host}:{port}/  (API docs: /api/v1/docs/, admin: /admin/)"
            )
            options = dict(
                host=host,
                port=port,
                fd=fd,
                workers=workers,
                log_level=settings.CLAW_UVICORN_LOG_LEVEL,
                # The project's logging (settings.LOGGING), not uvicorn's default: its handlers
                # mask the keys and tokens in gateway and capability URL paths. A copy, because
                # dictConfig consumes parts of the dict it is given.
                log_config=copy.deepcopy(settings.LOGGING),
                lifespan="off",
                # Header and body deadlines and a per-address connection bound, which
                # uvicorn lacks (settings "serve": CLAW_HEADER_TIMEOUT_S and the rest).
                http=GUARDED_HTTP,
            )
            if not run_uvicorn("claw_site.asgi:application", options, workers=workers, on_exit=stop.set):
                sys.exit(STARTUP_FAILURE)  # uvicorn logged why (the port is taken, ...)
        except _Stopped:
            pass
        finally:
            stop.set()
            for child in children:
                _terminate(child)
            for thread in threads:
                thread.join(timeout=SWEEP_JOIN_TIMEOUT_S)

    def _start_demo_upstream(self, sock: socket.socket) -> subprocess.Popen:
        """Start the demo upstream on the listening socket ``sock`` (the child inherits it;
        this process closes its copy), wait until it answers, and make it the gateway's
        upstream (environment and settings, so uvicorn workers inherit it)."""
        port = sock.getsockname()[1]
        with sock:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "claw_site.demo.upstream",
                    "--fd",
                    str(sock.fileno()),
                    # Images in prompts as a VLM server's placeholder runs (the screenshot agent).
                    "--image-tokens",
                    str(DEMO_IMAGE_TOKENS),
                ],  # fmt: skip
                cwd=settings.BASE_DIR,
                pass_fds=(sock.fileno(),),
                preexec_fn=_die_with_parent,  # safe: no threads are running yet
            )
        url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise CommandError(
                    f"the demo upstream exited at start (status {proc.returncode}); "
                    "set CLAW_UPSTREAM_URL for a real server, or CLAW_DEMO=0"
                )
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                _terminate(proc)
                raise CommandError(
                    f"the demo upstream did not answer on {url} within {STARTUP_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.05)
        os.environ["CLAW_UPSTREAM_URL"] = url
        settings.CLAW_UPSTREAM_URL = url
        self.stdout.write(f"Demo upstream (answers like vLLM, toy model) on {url}  [pid {proc.pid}]")
        return proc

    def _demo_traffic(self, base_url: str, key: str, stop: threading.Event, pace_s: float) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not stop.is_set():
            try:
                if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stderr.write(f"Demo traffic not started: {base_url}/healthz did not answer")
                return
            stop.wait(0.1)
        self.stdout.write(
            f"Demo traffic: black-box agents via {base_url}/t/<trajectory>/<group>/v1 and white-box agents "
            f"via /api/v1/steps, as API key '{DEMO_KEY_NAME}'"
        )
        close_old_connections()
        run_demo_traffic(base_url, key, stop=stop, pace_s=pace_s)


@dataclass(frozen=True, slots=True)
class Periodic:
    """One entry of celery beat's schedule, as serve runs it."""

    name: str  # the entry's key in CELERY_BEAT_SCHEDULE
    task: str  # the registered name of its task
    every_s: float  # its interval


def beat_schedule() -> list[Periodic]:
    """settings.CELERY_BEAT_SCHEDULE, every entry, in its order: what celery beat would run.
    Each task must be registered (a typo fails here, at start, not silently later); an entry
    must be an interval (seconds, a timedelta or celery's ``schedule``): embedded mode runs
    no crontab."""
    # Import the apps' tasks modules now (autodiscovery is lazy). Not loader.import_default_modules:
    # its Django fixup runs django.setup() again, which reconfigures logging.
    celery_app.autodiscover_tasks(force=True)
    out = []
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        if entry["task"] not in celery_app.tasks:
            raise CommandError(f"CELERY_BEAT_SCHEDULE[{name!r}]: no task named {entry['task']!r}")
        every = entry["schedule"]
        every = getattr(every, "run_every", every)  # celery.schedules.schedule
        if isinstance(every, timedelta):
            every = every.total_seconds()
        if not isinstance(every, int | float) or isinstance(every, bool) or every <= 0:
            raise CommandError(
                f"CELERY_BEAT_SCHEDULE[{name!r}]: serve runs intervals only (seconds or a timedelta), "
                f"not {entry['schedule']!r}; set REDIS_URL and run celery beat"
            )
        out.append(Periodic(name=name, task=entry["task"], every_s=float(every)))
    return out


def sweep_forever(
    stop: threading.Event, schedule: list[Periodic], *, clock: Callable[[], float] = time.monotonic
) -> None:
    """Run each entry of ``schedule`` (``beat_schedule``), its task called in-process by
    name, every ``every_s`` seconds from now until ``stop`` is set: celery beat's schedule for
    embedded mode. Entries due together run in the schedule's order. Never raises: a failed
    task is logged and its next run comes on time, the other entries' too. The thread's
    database connections are closed after every round, so none is left idle (or holding
    SQLite's WAL) between runs, nor open at exit."""
    start = clock()
    due = {p.name: start + p.every_s for p in schedule}
    while schedule and not stop.wait(max(0.0, min(due.values()) - clock())):
        now = clock()
        try:
            close_old_connections()
            for p in schedule:
                if due[p.name] > now:
                    continue
                # The next run is one interval after this one was due: no drift, and a run
                # that took longer than its interval is not repeated to catch up.
                due[p.name] += p.every_s * (int((now - due[p.name]) // p.every_s) + 1)
                _run_periodic(p)
        finally:
            connections.close_all()


def _run_periodic(p: Periodic) -> None:
    try:
        result = celery_app.tasks[p.task]()
    except Exception:  # noqa: BLE001 - the loop must outlive a failed run (the DB restarting)
        log.exception("periodic task %s failed; the next run is in %g s", p.task, p.every_s)
        return
    if result and (not isinstance(result, dict) or any(result.values())):
        log.info("%s: %s", p.task, result)


def _prepare_multiprocess_metrics() -> None:
    """With PROMETHEUS_MULTIPROC_DIR set, create it and delete the previous run's sample files
    (prometheus_client's multiprocess mode sums every file there; stale ones would count
    twice). Created here, at start, never at import."""
    folder = multiprocess_dir()
    if not folder:
        return
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)


def _demo_key() -> str:
    """The clear "demo-agent" key (scopes ingest + read): the one in var/demo-agent.key while it
    is still valid, else a newly created one written there with mode 0600."""
    clear, _ = stored_key(
        name=DEMO_KEY_NAME,
        filename=DEMO_KEY_FILE,
        scopes=[Scope.INGEST, Scope.READ],
        source_name=DEMO_KEY_NAME,
    )
    return clear


def _demo_upstream_socket(port: int) -> socket.socket:
    """The demo upstream's listening socket on 127.0.0.1, bound here so that the port cannot be
    taken between choosing it and serving on it: CLAW_DEMO_UPSTREAM_PORT when set (CommandError,
    one line, when it is taken), else PORT+1, else (taken) a port the kernel picks."""
    explicit = settings.CLAW_DEMO_UPSTREAM_PORT
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own bind
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # see _no_delay
        try:
            sock.bind(("127.0.0.1", explicit or port + 1))
        except OSError as e:
            if explicit:
                raise CommandError(
                    f"the demo upstream's port {explicit} (CLAW_DEMO_UPSTREAM_PORT) is taken: "
                    f"{e.strerror}; unset CLAW_DEMO_UPSTREAM_PORT to let serve pick a free port"
                ) from None
            sock.bind(("127.0.0.1", 0))
        sock.listen(2048)  # uvicorn's own default backlog
    except BaseException:
        sock.close()
        raise
    return sock


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_uvicorn(app: str, options: dict[str, Any], *, workers: int, on_exit: Callable[[], None]) -> bool:
    """Serve ``app`` with uvicorn until a signal ends it; False when it never started. The one
    place serve starts uvicorn (tests stub it here). With one process (`make run`), the demo
    traffic stops (``on_exit``) as soon as a signal arrives, not after the server has closed
    (its requests would log "connection refused")."""
    if workers > 1:
        uvicorn.run(app, **options)
        return True
    server = _Server(uvicorn.Config(app, **options), on_exit=on_exit)
    server.run()
    return server.started


class _Server(uvicorn.Server):
    """uvicorn's server, calling ``on_exit`` when told to stop (SIGINT, SIGTERM)."""

    def __init__(self, config: uvicorn.Config, *, on_exit: Callable[[], None]):
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


class _Stopped(Exception):
    """SIGINT or SIGTERM: stop serving, reap the children, exit 0."""


def _raise_stopped(signum: int, frame: Any) -> None:
    # Ignore a second signal while the `finally` of handle() reaps the children.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise _Stopped(signum)


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when serve dies (even by SIGKILL)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the `finally` in handle() still terminates the child on a clean exit


def _no_delay(fd: int) -> None:
    """TCP_NODELAY on an inherited listening socket (accepted connections inherit it):
    uvicorn wraps an fd as AF_UNIX, so asyncio would not set it, and Nagle's algorithm would
    stall responses written in pieces."""
    sock = socket.socket(fileno=os.dup(fd))  # family auto-detected from the fd
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()
