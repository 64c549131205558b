"""`manage.py serve` in demo mode: the demo upstream child, demo agents writing steps, cleanup.

Each test runs the real command in a subprocess against its own database (see tests/live.py).
"""

from __future__ import annotations

import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.live import ROOT, LiveServer, free_port

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc for child pids"),
]

DEADLINE_S = 45


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A migrated database and the environment of `make run` in demo mode, fast-paced."""
    server = LiveServer(
        tmp_path, {"CLAW_DEMO": "1", "CLAW_DEMO_PACE_S": "0.05", "CLAW_DEMO_UPSTREAM_PORT": str(free_port())}
    )
    server.env["PORT"] = str(server.port)
    server.env.pop("CLAW_UPSTREAM_URL", None)
    server.manage("migrate", "--noinput", "-v", "0")
    try:
        yield server
    finally:
        server.close()


def start_serve(server: LiveServer, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve"],
            cwd=ROOT,
            env=server.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_for(lambda: _healthy(server.url), proc, log, "serve to answer /healthz")
    return proc


def stop_serve(proc: subprocess.Popen, sig: int) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("serve did not exit within 30 s of the signal") from None


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"serve exited while waiting for {what}:\n{log.read_text()}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


def children_of(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out |= {int(c) for c in (task / "children").read_text().split()}
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def demo_steps(url: str, key: str) -> list[dict]:
    """Every step in the pool, following the cursor."""
    steps: list[dict] = []
    nxt: str | None = f"{url}/api/v1/steps?page_size=1000"
    while nxt:
        page = httpx.get(nxt, headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
        steps += page["results"]
        nxt = page.get("next")
    return steps


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _answers(url: str) -> bool:
    try:
        httpx.get(url, timeout=1)
        return True
    except httpx.HTTPError:
        return False


def test_serve_runs_demo_upstream_and_agents_then_reaps_them(demo_server: LiveServer, tmp_path: Path):
    # given `manage.py serve` in demo mode with no upstream configured
    reader = demo_server.make_key("read")
    log = tmp_path / "serve.log"
    proc = start_serve(demo_server, log)
    upstream = f"http://127.0.0.1:{demo_server.env['CLAW_DEMO_UPSTREAM_PORT']}/v1"
    try:
        # then the demo upstream child answers like vLLM
        kids = children_of(proc.pid)
        assert len(kids) == 1, kids
        assert httpx.get(f"{upstream}/models").json()["data"][0]["id"] == "claw-demo"

        # and steps of both white-box and black-box demo agents appear
        def both_kinds() -> bool:
            uids = {s["trajectory_uid"] for s in demo_steps(demo_server.url, reader)}
            bb = {u for u in uids if u.startswith("demo-bb-")}
            return any(u.startswith("demo-wb-") for u in uids) and len(bb) >= 2

        wait_for(both_kinds, proc, log, "steps from the demo agents")
        # and the black-box steps carry the upstream's own ids, with no drift across turns
        steps = demo_steps(demo_server.url, reader)
        black = [s for s in steps if s["trajectory_uid"].startswith("demo-bb-")]
        white = [s for s in steps if s["trajectory_uid"].startswith("demo-wb-")]
        assert {s["token_source"] for s in black} == {"upstream"}
        assert not any(s["drift"] for s in steps)
        assert any(s["step_index"] > 0 for s in black)
        assert all(s["prompt_group_uid"].startswith("demo-wb-g-") and s["rollout_logprobs"] for s in white)
        # and the agents' key is kept private for restarts
        key_file = tmp_path / "demo-agent.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert (
            httpx.get(
                f"{demo_server.url}/api/v1/stats", headers={"Authorization": f"Bearer {key}"}
            ).status_code
            == 200
        )
    finally:
        # when serve gets SIGTERM
        code = stop_serve(proc, signal.SIGTERM)
    # then it exits and its children are gone
    assert code in (0, 128 + signal.SIGTERM, -signal.SIGTERM), code
    assert not any(alive(k) for k in kids)
    assert not _answers(f"{upstream}/models")
    out = log.read_text()
    for line in ("Demo upstream (answers like vLLM", "Claw-R1 listening on", "Demo traffic:"):
        assert line in out, out
    assert "Traceback" not in out, out

    # when serve starts again and is stopped with SIGINT (Ctrl-C)
    proc = start_serve(demo_server, log)
    try:
        kids = children_of(proc.pid)
        wait_for(lambda: log.read_text().count("Demo traffic:") == 2, proc, log, "demo traffic to restart")
    finally:
        stop_serve(proc, signal.SIGINT)
    # then the stored key was reused, and the children are gone again
    assert (tmp_path / "demo-agent.key").read_text().strip() == key
    assert kids and not any(alive(k) for k in kids)


def test_claw_demo_0_starts_neither_upstream_nor_agents(demo_server: LiveServer, tmp_path: Path):
    # given CLAW_DEMO=0
    demo_server.env["CLAW_DEMO"] = "0"
    log = tmp_path / "serve.log"
    # when serve starts
    proc = start_serve(demo_server, log)
    try:
        # then it has no child process and no demo key
        time.sleep(0.5)
        assert children_of(proc.pid) == set()
        assert not (tmp_path / "demo-agent.key").exists()
        assert not _answers(f"http://127.0.0.1:{demo_server.env['CLAW_DEMO_UPSTREAM_PORT']}/v1/models")
    finally:
        stop_serve(proc, signal.SIGTERM)
    assert "Demo" not in log.read_text()
