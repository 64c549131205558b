"""The first hour of `make run` (migrate, bootstrap, serve) without traps: the demo upstream
finds a port when PORT+1 is taken (and says which setting to change when an explicit one is),
bootstrap prints the admin and trainer keys the README's examples use, startup prints none of
the warnings it used to, and SIGINT or SIGTERM ends serve with exit code 0 and its children
gone.

Each test runs the real commands in subprocesses against their own database (tests/live.py).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.gateway.test_demo_traffic import alive, demo_steps, listening_ports
from tests.live import ROOT, LiveServer, listening_socket

pytestmark = pytest.mark.live

DEADLINE_S = 60
UPSTREAM_RE = re.compile(r"Demo upstream \(answers like vLLM, toy model\) on (http://127\.0\.0\.1:(\d+)/v1)")
# What startup used to print (the words): a system check warning, kombu's and Django's.
STARTUP_WARNINGS = ("models.W040", "No hostname was supplied", "StreamingHttpResponse", "Traceback")
# Any warning at all: "warning" in any case (logged WARNING, Python's RuntimeWarning: ...), or a
# system check id (models.W040).
WARNING_LINE = re.compile(r"(?i:warning)|\bW\d{3}\b")


def wait_until(cond: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str) -> None:
    """Poll ``cond`` until it holds; fail when ``proc`` exits or DEADLINE_S passes first."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(
                f"serve exited ({proc.returncode}) while waiting for {what}:\n{log.read_text()}"
            )
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def manage(server: LiveServer, *args: str) -> str:
    """``manage.py *args`` in the server's environment: its stdout and stderr together."""
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout
    return out.stdout


def demo_serve(var_dir: Path) -> LiveServer:
    """`manage.py serve` in demo mode as `make run` starts it (no upstream, no upstream port
    set), fast-paced, on the LiveServer's inherited socket."""
    server = LiveServer(var_dir, {"CLAW_DEMO": "1", "CLAW_DEMO_PACE_S": "0.05"}, serve=True)
    for name in ("CLAW_UPSTREAM_URL", "CLAW_DEMO_UPSTREAM_PORT"):
        server.env.pop(name, None)
    return server


@dataclass
class FirstStart:
    """`make run`'s three steps on a fresh var dir, with PORT+1 held by another socket."""

    server: LiveServer
    migrate_out: str
    bootstrap_out: str
    blocker: socket.socket  # this test's socket listening on PORT+1

    @property
    def upstream(self) -> tuple[str, int]:
        match = UPSTREAM_RE.search(self.server.log_path.read_text())
        assert match, self.server.log_path.read_text()
        return match.group(1), int(match.group(2))


def hold_port(port: int) -> socket.socket | None:
    """A socket of this test listening on ``port`` of 127.0.0.1, or None when the port cannot
    be bound. A failed bind does not mean another process listens there: an outgoing
    connection's local port, or one in TIME_WAIT, fails a plain bind too, yet serve's
    SO_REUSEADDR bind takes it. So the fixture only trusts a port it holds itself."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        return None
    sock.listen()
    return sock


def demo_serve_with_next_port_held(var_dir: Path, tries: int = 20) -> tuple[LiveServer, socket.socket]:
    """A demo LiveServer whose PORT+1 this test holds listening: the kernel picks PORT, so
    PORT+1 may be in use by a connection; another pick is asked for until one is free."""
    for _ in range(tries):
        server = demo_serve(var_dir)
        blocker = hold_port(server.port + 1)
        if blocker is not None:
            return server, blocker
        server.close()
    raise AssertionError(f"no port of {tries} picked by the kernel had its next port free")


@pytest.fixture(scope="module")
def first_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FirstStart]:
    server, blocker = demo_serve_with_next_port_held(tmp_path_factory.mktemp("first-start"))
    try:
        migrate_out = manage(server, "migrate", "--noinput")
        bootstrap_out = manage(server, "bootstrap")
        server.start(migrate=False)
        yield FirstStart(server, migrate_out, bootstrap_out, blocker)
    finally:
        server.close()
        blocker.close()


def test_the_demo_upstream_takes_another_port_when_port_plus_one_is_taken(first_start: FirstStart):
    # given PORT+1 taken by a listening socket when serve started (the fixture)
    server = first_start.server
    url, port = first_start.upstream
    # then serve answers, and its demo upstream child listens on another port and answers there
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert port != server.port + 1
    proc = psutil.Process(server.proc.pid)
    assert port in listening_ports(proc)
    assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "claw-demo"
    # and the gateway forwards to it: the demo agents' steps arrive
    key = server.make_key("read")
    wait_until(lambda: len(demo_steps(server.url, key)) > 0, server.proc, server.log_path, "demo steps")


def test_startup_prints_none_of_the_old_warnings(first_start: FirstStart):
    # given serve running with the demo traffic writing steps (eager tasks, streamed answers)
    server = first_start.server
    key = server.make_key("read")
    wait_until(
        lambda: any(s["trajectory_uid"].startswith("demo-bb-") for s in demo_steps(server.url, key)),
        server.proc,
        server.log_path,
        "black-box demo steps",
    )
    # then neither migrate, bootstrap nor serve printed any of the warnings startup used to print
    outputs = {
        "migrate": first_start.migrate_out,
        "bootstrap": first_start.bootstrap_out,
        "serve": server.log_path.read_text(),
    }
    found = {(step, w) for step, out in outputs.items() for w in STARTUP_WARNINGS if w in out}
    assert found == set(), outputs
    # and none printed any warning at all: nothing a user did not cause (make run sets nothing)
    lines = [
        (step, line)
        for step, out in outputs.items()
        for line in out.splitlines()
        if WARNING_LINE.search(line)
    ]
    assert lines == [], lines


def test_the_warning_pattern_finds_logged_warnings_and_check_ids():
    # given lines as Django's checks, Python's warnings and the logging format print them
    assert WARNING_LINE.search("?: (models.W040) SQLite does not support indexes with non-key columns.")
    assert WARNING_LINE.search("/x.py:3: RuntimeWarning: coroutine was never awaited")
    assert WARNING_LINE.search("x.py:537: Warning: StreamingHttpResponse must consume synchronous iterators")
    assert WARNING_LINE.search("2026-12-01 15:53:56,684 WARNING claw_site serve Embedded mode")
    # then lines that only look alike do not match
    assert WARNING_LINE.search("Claw-R1 listening on http://127.0.0.1:8000/") is None
    assert WARNING_LINE.search("Demo upstream on http://127.0.0.1:8001/v1  [pid 4040]") is None


def test_bootstrap_prints_admin_and_trainer_keys_that_work(first_start: FirstStart):
    # given the line bootstrap printed for the README's examples
    out = first_start.bootstrap_out
    match = re.search(r"export ADMIN_KEY=(\S+) TRAINER_KEY=(\S+)\n", out)
    assert match, out
    admin, trainer = match.groups()
    server = first_start.server
    # then the admin key reads the stats and creates a dataset (the README's curation example)
    auth = {"Authorization": f"Bearer {admin}"}
    assert httpx.get(f"{server.url}/api/v1/stats", headers=auth).status_code == 200
    created = httpx.post(f"{server.url}/api/v1/datasets", headers=auth, json={"name": "first-hour"})
    assert created.status_code == 201, created.text
    # and the trainer key holds consume and policy, and not admin
    trainer_auth = {"Authorization": f"Bearer {trainer}"}
    assert httpx.get(f"{server.url}/api/v1/policy-versions", headers=trainer_auth).status_code == 200
    assert httpx.get(f"{server.url}/api/v1/stats", headers=trainer_auth).status_code == 200
    refused = httpx.post(f"{server.url}/api/v1/datasets", headers=trainer_auth, json={"name": "trainer-ds"})
    assert refused.status_code == 403, refused.text
    # and both are the ones kept in the var dir for the next start
    assert (server.var_dir / "admin.key").read_text().strip() == admin
    assert (server.var_dir / "trainer.key").read_text().strip() == trainer


@pytest.mark.backend_independent  # a port and a process: the same on every backend
def test_an_explicit_demo_upstream_port_that_is_taken_stops_serve_with_one_line(tmp_path: Path):
    # given CLAW_DEMO_UPSTREAM_PORT set to a port another socket listens on
    server = demo_serve(tmp_path)
    taken = listening_socket()
    port = taken.getsockname()[1]
    server.env["CLAW_DEMO_UPSTREAM_PORT"] = str(port)
    try:
        manage(server, "migrate", "--noinput", "-v", "0")
        # when serve starts
        out = subprocess.run(
            server._command(),
            cwd=ROOT,
            env=server.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(server._sock.fileno(),),
            timeout=120,
        )
    finally:
        taken.close()
        server.close()
    # then it fails at once with one line naming the port and the setting, and no traceback
    assert out.returncode != 0, out.stdout
    lines = [line for line in out.stdout.splitlines() if str(port) in line]
    assert len(lines) == 1, out.stdout
    assert "CLAW_DEMO_UPSTREAM_PORT" in lines[0] and "taken" in lines[0], out.stdout
    assert "Traceback" not in out.stdout and "Claw-R1 listening" not in out.stdout


@pytest.mark.backend_independent  # signals and processes: the same on every backend
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_serve_with_0_and_its_children_gone(tmp_path: Path, sig: signal.Signals):
    # given serve running in demo mode, its demo traffic started
    server = demo_serve(tmp_path)
    try:
        server.start()
        proc = psutil.Process(server.proc.pid)
        wait_until(
            lambda: "Demo traffic:" in server.log_path.read_text(), server.proc, server.log_path, "traffic"
        )
        kids = proc.children(recursive=True)
        assert kids, "no demo upstream child"
        # when it gets the signal (Ctrl-C, or a supervisor's stop)
        server.proc.send_signal(sig)
        code = server.proc.wait(timeout=DEADLINE_S)
        server.proc = None
    finally:
        server.close()
    # then it exits 0, its children (the demo upstream) are gone, and nothing was dumped
    assert code == 0, (code, server.log_path.read_text())
    assert not any(alive(k) for k in kids), kids
    assert "Traceback" not in server.log_path.read_text()


@pytest.mark.backend_independent  # signals and processes: the same on every backend
@pytest.mark.parametrize(
    "how", ["ctrl-c to the group", "sigterm to make"], ids=["SIGINT-group", "SIGTERM-make-pid"]
)
def test_make_run_stops_on_ctrl_c_or_a_supervisors_sigterm(tmp_path: Path, how: str):
    """`make run` as a user starts it, with this interpreter's venv as the Makefile's VENV (its
    install step not remade) and serve on the test's socket (SERVE_ARGS): Ctrl-C, which the
    terminal sends to the whole foreground process group, ends it with no "make: ***" line;
    SIGTERM to make's PID alone (what a supervisor sends: docs/operations.md) ends make, serve
    and the demo upstream too."""
    # given make run in its own process group (as a terminal's foreground job), demo traffic on
    server = demo_serve(tmp_path)
    venv = Path(sys.prefix)
    if not (venv / "bin" / "python").exists() or sys.prefix == sys.base_prefix:
        pytest.skip("make run needs the interpreter's venv as its VENV")
    log = tmp_path / "make-run.log"
    fd = server._sock.fileno()
    args = ["make", "--no-print-directory", "run", f"VENV={venv}", "-o", f"{venv}/.installed"]
    args.append(f"SERVE_ARGS=--fd {fd}")
    try:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**server.env, "HOST": "127.0.0.1", "PORT": str(server.port)},
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(fd,),
                start_new_session=True,
            )
        try:
            wait_until(lambda: "Demo traffic:" in log.read_text(), proc, log, "make run's demo traffic")
            assert httpx.get(f"{server.url}/healthz").status_code == 200
            tree = psutil.Process(proc.pid).children(recursive=True)
            # when Ctrl-C reaches the group, or a supervisor's SIGTERM reaches make alone
            if how == "ctrl-c to the group":
                os.killpg(proc.pid, signal.SIGINT)
            else:
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=DEADLINE_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    finally:
        server.close()
    text = log.read_text()
    if how == "ctrl-c to the group":
        # then make reports no error (serve exited 0; make itself ends by the SIGINT it got, or 0)
        assert code in (0, -signal.SIGINT), (code, text)
        assert "make: ***" not in text, text
    else:
        # then make ends by the signal (it passes SIGTERM on to serve and says so)
        assert code in (0, -signal.SIGTERM, 2), (code, text)
    assert "Traceback" not in text, text
    # and serve and the demo upstream are gone
    assert tree and not any(alive(p) for p in tree), tree
