"""`manage.py serve` in demo mode: the demo upstream child, demo agents writing steps, the
curation state they leave (readiness, ready groups, quality flags, the review queue), cleanup;
and the readiness sweep serve runs in embedded mode.

Each test runs the real command in a subprocess against its own database (see tests/live.py).
"""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.live import ROOT, LiveServer, free_ports, live_server

pytestmark = pytest.mark.live

DEADLINE_S = 45
# serve binds the port numbers it is given itself, so they are picked free beforehand and may
# be taken by another process before it binds them; it is then started again on new ports.
PORT_ATTEMPTS = 5
PORT_TAKEN = "address already in use"  # uvicorn's words, from serve or from its demo upstream


@pytest.fixture
def demo_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A migrated database and the environment of `make run` in demo mode, fast-paced."""
    server = LiveServer(tmp_path, {"CLAW_DEMO": "1", "CLAW_DEMO_PACE_S": "0.05"})
    server.env.pop("CLAW_UPSTREAM_URL", None)
    server.manage("migrate", "--noinput", "-v", "0")
    try:
        yield server
    finally:
        server.close()


@dataclass
class Serve:
    """A running `manage.py serve`: its process, its URL, its demo upstream's base URL, and
    its log from the point this run of it started."""

    proc: psutil.Popen
    url: str
    upstream: str
    log: Path
    log_start: int

    def output(self) -> str:
        with open(self.log, "rb") as f:
            f.seek(self.log_start)
            return f.read().decode(errors="replace")


def start_serve(server: LiveServer, log: Path) -> Serve:
    """Start `manage.py serve` and return once it listens on its port, in demo mode its demo
    upstream child on its own, and /healthz answers."""
    for _ in range(PORT_ATTEMPTS):
        serve = _serve_on_free_ports(server, log)
        if serve is not None:
            return serve
    raise AssertionError(f"serve found a port taken {PORT_ATTEMPTS} times:\n{log.read_text()[-4000:]}")


def _serve_on_free_ports(server: LiveServer, log: Path) -> Serve | None:
    """One try of start_serve; None (and serve stopped) when one of its ports was taken."""
    port, upstream_port = free_ports(2)
    server.env.update(PORT=str(port), CLAW_DEMO_UPSTREAM_PORT=str(upstream_port))
    log_start = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        proc = psutil.Popen(
            [sys.executable, "manage.py", "serve"],
            cwd=ROOT,
            env=server.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    serve = Serve(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{upstream_port}/v1", log, log_start)
    ports = {port, upstream_port} if server.env["CLAW_DEMO"] == "1" else {port}
    # Its own ports are checked first: another server on a port taken from it may answer too.
    ready = wait_for(
        lambda: ports <= listening_ports(proc) and _healthy(serve.url),
        serve,
        "serve to listen and answer /healthz",
        give_up=lambda: PORT_TAKEN in serve.output().lower(),
    )
    if ready:
        return serve
    stop_serve(proc, signal.SIGTERM)
    return None


def stop_serve(proc: subprocess.Popen, sig: int) -> int:
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("serve did not exit within 30 s of the signal") from None


def wait_for(
    cond: Callable[[], bool], serve: Serve, what: str, *, give_up: Callable[[], bool] | None = None
) -> bool:
    """Poll ``cond`` until it holds (True) or ``give_up`` does (False); fail when serve exits
    or DEADLINE_S passes first."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        exited = serve.proc.poll() is not None
        if give_up is not None and give_up():
            return False
        if exited:
            raise AssertionError(f"serve exited while waiting for {what}:\n{serve.output()}")
        if cond():
            return True
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{serve.output()[-4000:]}")


def listening_ports(proc: psutil.Process) -> set[int]:
    """The TCP ports ``proc`` and its children listen on. Processes come and go while this
    reads /proc: one that is gone (or not yet readable) simply has no ports."""
    ports: set[int] = set()
    try:
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return ports
    for p in family:
        try:
            ports |= {c.laddr.port for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return ports


def children(proc: psutil.Process) -> list[psutil.Process]:
    """The child processes of ``proc`` (none once it is gone)."""
    try:
        return proc.children()
    except psutil.NoSuchProcess:
        return []


def alive(p: psutil.Process) -> bool:
    """Whether ``p`` still runs: not exited, not a zombie, and its pid not reused since (psutil
    compares the process's start time)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def demo_steps(url: str, key: str) -> list[dict]:
    """Every step in the pool, following the cursor."""
    steps: list[dict] = []
    nxt: str | None = f"{url}/api/v1/steps?page_size=1000"
    while nxt:
        page = httpx.get(nxt, headers={"Authorization": f"Bearer {key}"}, timeout=10).json()
        steps += page["results"]
        nxt = page.get("next")
    return steps


# Run in the server's own environment (its database) by `manage.py shell`: the curation state
# the demo traffic left, read through the same selectors as the pages.
CURATION_STATE = """
import json
from collections import Counter
from datetime import timedelta
from django.db.models import F
from django.utils import timezone
from curation.selectors.review import review_candidates, review_progress
from curation.services.review import review_queue_default
from pool.flags import QUALITY_NAMES, READY, names
from pool.models import PromptGroup, RewardEvent, Step, Task, TaskSampleRecord, Trajectory

flags = Counter()
for value in Step.objects.exclude(quality_flags=0).values_list("quality_flags", flat=True):
    flags.update(names(value, QUALITY_NAMES))
queue = review_queue_default()
print(json.dumps({
    "ready_steps": Step.objects.filter(readiness=READY).count(),
    "ready_groups": PromptGroup.objects.filter(ready_at__isnull=False).count(),
    "flags": flags,
    "statuses": Counter(Trajectory.objects.values_list("status", flat=True)),
    # rewards set on a trajectory after it completed (the judge's)
    "late_rewards": RewardEvent.objects.filter(
        trajectory__completed_at__lt=F("created_at") - timedelta(milliseconds=100),
        trajectory__status="completed",
    ).count(),
    "review_candidates": review_candidates(queue, now=timezone.now()).count(),
    "review_progress": review_progress(queue),
    # the task sampler picked the groups' tasks, and their statistics filled
    "seen_tasks": Task.objects.filter(set_name="demo", seen__gt=0).count(),
    "task_samples": TaskSampleRecord.objects.count(),
}))
"""


def curation_state(server: LiveServer) -> dict:
    return json.loads(server.manage("shell", "-c", CURATION_STATE).strip().splitlines()[-1])


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


# Demo mode is the embedded defaults' (`make run`): CI's SQLite pass runs these two; its
# PostgreSQL pass skips them (what the agents write goes through doors tested on PostgreSQL in
# tests/gateway/, and starting and reaping children does not depend on the backend).
@pytest.mark.backend_independent
def test_serve_runs_demo_upstream_and_agents_then_reaps_them(demo_server: LiveServer, tmp_path: Path):
    # given `manage.py serve` in demo mode with no upstream configured
    reader = demo_server.make_key("read")
    log = tmp_path / "serve.log"
    serve = start_serve(demo_server, log)
    try:
        # then the demo upstream child answers like vLLM
        kids = children(serve.proc)
        assert len(kids) == 1, kids
        assert httpx.get(f"{serve.upstream}/models").json()["data"][0]["id"] == "claw-demo"

        # and steps of the white-box, black-box, Anthropic, Responses and screenshot demo agents
        # appear (the Anthropic agent's compaction as a second branch; the screenshot agent's
        # sliding window of screenshots makes a branch per turn, so it is left out of that check)
        def every_kind() -> bool:
            steps = demo_steps(serve.url, reader)
            uids = {s["trajectory_uid"] for s in steps}
            bb = {u for u in uids if u.startswith("demo-bb-")}
            doors = {
                s["trajectory_uid"][:10]
                for s in steps
                if s["branch"] > 0 and not s["trajectory_uid"].startswith("demo-ss-")
            } | {u[:10] for u in uids if u.startswith("demo-resp-")}
            return (
                any(u.startswith("demo-wb-") for u in uids)
                and len(bb) >= 2
                and len(doors) == 2
                and any(u.startswith("demo-ss-") for u in uids)
            )

        wait_for(every_kind, serve, "steps from the demo agents")
        # and the black-box steps carry the upstream's own ids, with no drift across turns
        steps = demo_steps(serve.url, reader)
        black = [s for s in steps if s["trajectory_uid"].startswith("demo-bb-")]
        white = [s for s in steps if s["trajectory_uid"].startswith("demo-wb-")]
        assert {s["token_source"] for s in black} == {"upstream"}
        assert not any(s["drift"] for s in steps)
        assert any(s["step_index"] > 0 for s in black)
        assert all(s["prompt_group_uid"].startswith("demo-wb-g-") and s["rollout_logprobs"] for s in white)
        protocols = {s["trajectory_uid"][:10]: s["metadata"].get("protocol") for s in steps}
        assert (
            protocols["demo-anth-"] == "anthropic-messages" and protocols["demo-resp-"] == "openai-responses"
        )
        # and the agents' key is kept private for restarts
        key_file = tmp_path / "demo-agent.key"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert (
            httpx.get(f"{serve.url}/api/v1/stats", headers={"Authorization": f"Bearer {key}"}).status_code
            == 200
        )
    finally:
        # when serve gets SIGTERM
        code = stop_serve(serve.proc, signal.SIGTERM)
    # then it exits 0 and its children are gone (serve waits for them before it exits)
    assert code == 0, code
    assert not any(alive(k) for k in kids)
    assert not _answers(f"{serve.upstream}/models")
    out = serve.output()
    for line in ("Demo upstream (answers like vLLM", "Claw-R1 listening on", "Demo traffic:"):
        assert line in out, out
    assert "Traceback" not in out, out

    # when serve starts again and is stopped with SIGINT (Ctrl-C)
    serve = start_serve(demo_server, log)
    try:
        kids = children(serve.proc)
        wait_for(lambda: "Demo traffic:" in serve.output(), serve, "demo traffic to restart")
    finally:
        stop_serve(serve.proc, signal.SIGINT)
    # then the stored key was reused, and the children are gone again
    assert (tmp_path / "demo-agent.key").read_text().strip() == key
    assert kids and not any(alive(k) for k in kids)


@pytest.mark.backend_independent
def test_claw_demo_0_starts_neither_upstream_nor_agents(demo_server: LiveServer, tmp_path: Path):
    # given CLAW_DEMO=0
    demo_server.env["CLAW_DEMO"] = "0"
    log = tmp_path / "serve.log"
    # when serve starts
    serve = start_serve(demo_server, log)
    try:
        # then it has no child process and no demo key (both would exist before serve answers
        # /healthz: demo mode starts the upstream and writes the key before it serves)
        assert children(serve.proc) == []
        assert not (tmp_path / "demo-agent.key").exists()
        assert not _answers(f"{serve.upstream}/models")
    finally:
        stop_serve(serve.proc, signal.SIGTERM)
    assert "Demo" not in log.read_text()


def test_demo_traffic_fills_the_curation_pages(demo_server: LiveServer, tmp_path: Path):
    # given `manage.py serve` in demo mode
    serve = start_serve(demo_server, tmp_path / "serve.log")
    try:
        # when its demo agents have run a few groups of each kind
        state: dict = {}

        def shows_every_case() -> bool:
            state.update(curation_state(demo_server))
            flags, statuses = state["flags"], state["statuses"]
            return (
                state["ready_steps"] > 0
                and state["ready_groups"] > 0
                and {"truncated", "repetition", "zero_variance"} <= flags.keys()
                and {"completed", "failed", "abandoned"} <= statuses.keys()
                and state["late_rewards"] > 0
                and state["review_progress"]["done"] > 0
                and state["seen_tasks"] > 0
            )

        wait_for(shows_every_case, serve, "the demo traffic to show every curation case")
    finally:
        stop_serve(serve.proc, signal.SIGTERM)
    # then steps are ready to train on, and groups are ready
    assert state["ready_steps"] > 0 and state["ready_groups"] > 0, state
    # and quality flags fired: a degenerate rollout (truncated, repetitive), an easy group
    assert {"truncated", "repetition", "zero_variance"} <= state["flags"].keys(), state
    # and some rollouts failed or gave up, and some rewards came after their completion
    assert state["statuses"]["failed"] > 0 and state["statuses"]["abandoned"] > 0, state
    assert state["late_rewards"] > 0, state
    # and the default review queue has items to review, and some user feedback
    assert state["review_candidates"] > 0, state
    progress = state["review_progress"]
    assert progress["total"] > progress["done"] > 0, state
    # and the groups rolled out tasks the sampler picked, whose statistics fill the tasks page
    assert state["seen_tasks"] > 0 and state["task_samples"] > 0, state
    assert "Traceback" not in serve.output(), serve.output()


def test_serve_sweeps_in_process_without_redis(tmp_path: Path):
    # given serve in embedded mode (no REDIS_URL) with a fast sweep and a short idle timeout
    env = {"CLAW_SWEEP_SECONDS": "0.2", "CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS": "1", "REDIS_URL": ""}
    with live_server(tmp_path, env, serve=True) as server:
        key = server.make_key("ingest", "read")
        h = {"Authorization": f"Bearer {key}"}
        # and a group waiting for one rollout whose agent went silent after one step
        r = httpx.post(f"{server.url}/api/v1/groups", json={"uid": "g", "expected_rollouts": 1}, headers=h)
        assert r.status_code in (200, 201), r.text
        step = {
            "trajectory_uid": "silent",
            "prompt_group_uid": "g",
            "step_index": 0,
            "prompt_ids": [1, 2],
            "response_ids": [3],
        }
        r = httpx.post(f"{server.url}/api/v1/steps", json={"steps": [step]}, headers=h)
        assert r.status_code == 201, r.text

        # when the idle timeout passes, then the sweep abandons it and its group completes
        def status(path: str) -> str:
            return httpx.get(f"{server.url}/api/v1/{path}", headers=h, timeout=5).json()["status"]

        deadline = time.monotonic() + DEADLINE_S
        while status("trajectories/silent") != "abandoned":
            assert time.monotonic() < deadline, server.log_path.read_text()[-4000:]
            assert server.proc is not None and server.proc.poll() is None, server.log_path.read_text()
            time.sleep(0.1)
        assert status("groups/g") == "complete"
        proc = server.proc
    # and serve still exits cleanly, sweep thread included
    assert proc is not None and proc.returncode in (0, 128 + signal.SIGTERM, -signal.SIGTERM)
    out = server.log_path.read_text()
    assert "Readiness sweep in-process every 0.2 s" in out, out
    assert "Traceback" not in out, out


def test_serve_leaves_the_schedule_to_celery_beat_with_redis(tmp_path: Path):
    # given REDIS_URL (beat runs CELERY_BEAT_SCHEDULE); nothing needs to listen there to serve
    with live_server(tmp_path, {"REDIS_URL": "redis://127.0.0.1:9/0"}, serve=True) as server:
        # when serve answers, then it started no sweep of its own
        out = server.log_path.read_text()
    assert "Claw-R1 listening on" in out and "Readiness sweep" not in out, out


def test_sweep_forever_outlives_a_failed_run(monkeypatch):
    # given a sweep whose first run fails
    from claw_site.management.commands import serve
    from pool import tasks

    calls: list[int] = []
    second = threading.Event()

    def flaky() -> dict[str, int]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database restarting")
        second.set()
        return {"abandoned": 0}

    monkeypatch.setattr(tasks.readiness_sweep, "run", flaky)
    schedule = [serve.Periodic(name="readiness-sweep", task="pool.readiness_sweep", every_s=0.01)]
    stop = threading.Event()
    thread = threading.Thread(target=serve.sweep_forever, args=(stop, schedule), daemon=True)
    # when the loop runs
    thread.start()
    try:
        # then it runs again after the error
        assert second.wait(DEADLINE_S), calls
    finally:
        # and stops when told
        stop.set()
        thread.join(DEADLINE_S)
    assert not thread.is_alive()
