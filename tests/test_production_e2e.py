"""Production end to end: the Procfile's processes (migrate, `manage.py serve --workers 2`, a
Celery worker and beat, each its own process) on PostgreSQL and a private Redis, with
production settings. All at once: black-box agents (the official openai package, streaming
and not), white-box agents (claw_client), a service posting events and feedback, a reviewer
using the review page, and two trainers pulling with claw_client. Every step sent is stored
once, every ready step is delivered once to each consumer, and nothing failed.

Every client reaches the app through ``TlsTerminatingProxy``, which plays the load balancer
production runs behind (README, "Security"): the production settings stay as they are,
HTTPS redirect and secure cookies included.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from claw_client import ClawClient
from tests.gateway.conftest import start_upstream
from tests.live import ROOT, LiveServer, free_port, start_redis, stop_process

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")),
        reason="production mode needs PostgreSQL and Redis (DATABASE_URL and REDIS_URL)",
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary"),
]

DATASET = "e2e"
TRAINERS = ("trainer-a", "trainer-b")
# Black-box agents: each plays GROUPS groups of ROLLOUTS rollouts of TURNS chat calls.
BLACK_BOX_AGENTS = 4  # even-numbered ones stream
WHITE_BOX_AGENTS = 2  # agent 0 ends its rollouts with is_last, agent 1 with a completion call
GROUPS = 2
ROLLOUTS = 2
TURNS = 2
REVIEWS = 3
REVIEW_LABEL = "e2e-review"
SERVICE_LABEL = "e2e-service"
EVENT_TYPE = "e2e_test_run"
DEADLINE_S = 90.0


class TlsTerminatingProxy(httpx.HTTPTransport):
    """The load balancer in front of production: the client speaks https to it, it forwards
    plain http to the app with ``X-Forwarded-Proto: https`` (SECURE_PROXY_SSL_HEADER). So the
    clients keep secure cookies and the app's HTTPS redirect and CSRF origin checks apply."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        # A new request: the client keeps the https one for its cookies and redirects.
        headers = request.headers.copy()
        headers["X-Forwarded-Proto"] = "https"
        forwarded = httpx.Request(
            request.method,
            request.url.copy_with(scheme="http"),
            headers=headers,
            stream=request.stream,
            extensions=request.extensions,
        )
        return super().handle_request(forwarded)


class Recorder:
    """Every response any client saw, by status (thread-safe), and the writers' errors."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: Counter[int] = Counter()
        self.server_errors: list[str] = []
        self.errors: list[str] = []

    def hook(self, response: httpx.Response) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1
            if response.status_code >= 500:
                self.server_errors.append(f"{response.status_code} {response.request.url.path}")

    def client_kwargs(self) -> dict[str, Any]:
        return {"transport": TlsTerminatingProxy(), "event_hooks": {"response": [self.hook]}}

    def run(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        def target() -> None:
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                with self.lock:
                    self.errors.append(f"{name}: {exc!r}")

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread


def wait_for(
    predicate: Callable[[], Any],
    what: str,
    timeout: float = DEADLINE_S,
    explain: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``predicate`` until it is true (returned) or ``timeout`` passes (fails, saying
    ``what`` and what ``explain`` returns then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}: {explain() if explain else ''}")


def test_production_end_to_end(tmp_path):
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    server: LiveServer | None = None
    upstream, procs["upstream"] = start_upstream()
    try:
        redis_port = free_port()
        logs["redis"] = tmp_path / "redis.log"
        procs["redis"] = start_redis(redis_port, logs["redis"])
        queue = f"claw-e2e-{uuid.uuid4().hex[:8]}"
        password = secrets.token_urlsafe(16)
        server = LiveServer(
            tmp_path,
            {
                "DJANGO_SETTINGS_MODULE": "claw_site.settings.production",
                "DJANGO_SECRET_KEY": secrets.token_urlsafe(60),
                "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "CLAW_CELERY_QUEUE": queue,
                "CLAW_UPSTREAM_URL": upstream,
                "CLAW_SWEEP_SECONDS": "1",
                "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus"),
                "CLAW_USER_PASSWORD": password,
            },
            serve=True,
        )
        server.extra_args = ["--workers", "2"]
        logs["web"] = server.log_path
        # given the release step (migrate) and the web process with two workers
        server.start()
        wait_for(lambda: len(uvicorn_workers(server.proc.pid)) == 2, "two uvicorn worker processes", 60)
        # and a Celery worker and beat, each its own process
        celery = [sys.executable, "-m", "celery", "-A", "claw_site"]
        for name, args in {
            "worker": ["worker", "-Q", queue, "--concurrency", "2", "--hostname", f"{queue}@%h"],
            "beat": ["beat", "--schedule", str(tmp_path / "beat-schedule")],
        }.items():
            logs[name] = tmp_path / f"{name}.log"
            with open(logs[name], "wb") as log:  # the child keeps its own descriptor
                procs[name] = subprocess.Popen(
                    [*celery, *args, "--loglevel", "INFO"],
                    cwd=ROOT,
                    env=server.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        # and keys, a reviewer and a dataset admitting every ready step, made the real way
        agent_key = server.make_key("ingest", name="e2e-agents")
        # the environment service reports on the agents' rollouts: an admin grants it their
        # source (a key writes only into its sources' trajectories)
        service_key = (
            server.manage(
                "create_api_key",
                *("--name", "e2e-service", "--scope", "ingest", "--scope", "read"),
                *("--extra-source", "e2e-agents"),
            )
            .strip()
            .splitlines()[-1]
        )
        trainer_key = server.make_key("consume")
        admin_key = server.make_key("admin")
        server.manage("create_user", "--username", "rita", "--role", "reviewer", "--noinput")
        site = f"https://127.0.0.1:{server.port}"
        rec = Recorder()
        admin = ClawClient(site, admin_key, **rec.client_kwargs())
        admin.create_dataset(DATASET)

        # when everyone works at once
        sent: dict[str, int] = {}  # trajectory uid -> steps sent
        writers = [
            rec.run(f"black-box-{a}", lambda a=a: black_box_agent(site, agent_key, rec, a, sent))
            for a in range(BLACK_BOX_AGENTS)
        ]
        writers += [
            rec.run(f"white-box-{a}", lambda a=a: white_box_agent(site, agent_key, rec, a, sent))
            for a in range(WHITE_BOX_AGENTS)
        ]
        writers.append(rec.run("service", lambda: service(site, service_key, rec)))
        reviewed: list[str] = []
        writers.append(rec.run("reviewer", lambda: reviewer(site, password, rec, reviewed)))
        stop = threading.Event()
        delivered: dict[str, list[str]] = {name: [] for name in TRAINERS}
        trainers = [
            rec.run(name, lambda name=name: trainer(site, trainer_key, rec, name, stop, delivered[name]))
            for name in TRAINERS
        ]
        for w in writers:
            w.join(DEADLINE_S)
        assert not any(w.is_alive() for w in writers), "a writer did not finish"
        assert not rec.errors, rec.errors

        # then every step sent is stored once, with the indexes it was sent with
        stored = list_all(admin, "/steps")
        uids = [s["uid"] for s in stored]
        assert len(uids) == len(set(uids)) == sum(sent.values()) > 0
        by_trajectory: dict[str, list[int]] = {}
        for s in stored:
            by_trajectory.setdefault(s["trajectory_uid"], []).append(s["step_index"])
        assert {t: sorted(ix) for t, ix in by_trajectory.items()} == {
            t: list(range(n)) for t, n in sent.items()
        }
        # and once readiness settles (worker tasks, beat's sweeps) every step is ready and
        # admitted by the dataset
        wait_for(
            lambda: all(s["ready"] for s in list_all(admin, "/steps")),
            "every step ready",
            explain=lambda: [(s["uid"], s["readiness"]) for s in list_all(admin, "/steps") if not s["ready"]],
        )
        preview = admin.http.get(f"/datasets/{DATASET}/preview").raise_for_status().json()
        assert preview["steps"] == len(uids) and preview["groups"] == len(group_uids(sent))
        # and each trainer got every one of them exactly once, and is offered nothing more
        wait_for(
            lambda: (
                all(set(delivered[n]) == set(uids) for n in TRAINERS)
                and all(pending(admin, n) == 0 for n in TRAINERS)
            ),
            "both trainers to receive every ready step",
        )
        stop.set()
        for t in trainers:
            t.join(DEADLINE_S)
        assert not any(t.is_alive() for t in trainers) and not rec.errors, rec.errors
        with ClawClient(site, trainer_key, **rec.client_kwargs()) as claw:
            for name in TRAINERS:
                assert sorted(delivered[name]) == sorted(uids), name  # no duplicate
                assert not claw.pull(DATASET, consumer=name)

        # and the service's events and feedback and the reviewer's feedback are stored
        white_box = [t for t in sent if t.startswith("wb")]
        events = list_all(admin, f"/events?type={EVENT_TYPE}")
        assert sorted(e["trajectory_uid"] for e in events) == sorted(white_box)
        feedback = list_all(admin, f"/feedback?label={SERVICE_LABEL}")
        assert sorted(f["step_uid"] for f in feedback) == sorted(f"{t}:{TURNS - 1}" for t in white_box)
        reviews = list_all(admin, f"/feedback?label={REVIEW_LABEL}")
        assert sorted(f["trajectory_uid"] for f in reviews) == sorted(reviewed)
        assert len(reviewed) == REVIEWS and {f["author"] for f in reviews} == {"rita"}

        # and nothing failed: no 5xx, no gateway fault, an empty outbox, no reward failure
        assert not rec.server_errors, rec.server_errors
        assert rec.statuses[200] > 0
        for kind in ("upstream_error", "record_failed"):
            assert list_all(admin, f"/events?type={kind}") == []
        counts = server.manage(
            "shell",
            "-c",
            "from pool.models import OutboxTask, RewardFailure; "
            "print(OutboxTask.objects.count(), RewardFailure.objects.count())",
        )
        assert counts.split()[-2:] == ["0", "0"], counts
        # and beat sent its sweeps, which the worker ran, and no process logged an error
        wait_for(lambda: "pool.readiness_sweep" in logs["worker"].read_text(), "a sweep on the worker")
        beat_log = logs["beat"].read_text()
        for task in ("pool.readiness_sweep", "curation.leases_expire", "pool.outbox_relay"):
            assert "Sending due task" in beat_log and task in beat_log, beat_log[-2000:]
        for name in ("worker", "beat"):
            text = logs[name].read_text()
            assert not re.search(r"\bERROR\b|\bCRITICAL\b|Traceback", text), text[-4000:]
        requests = web_request_statuses(logs["web"].read_text())
        assert requests and max(requests) < 500, Counter(requests)
    except BaseException:
        for name, path in logs.items():
            if path.exists():
                print(f"--- {name} log (tail) ---\n{path.read_text(errors='replace')[-6000:]}")
        raise
    finally:
        for name in ("beat", "worker"):
            if name in procs:
                stop_process(procs[name])
        if server is not None:
            server.close()
        for name in ("redis", "upstream"):
            if name in procs:
                stop_process(procs[name])


# --- the actors --------------------------------------------------------------------------------
def black_box_agent(site: str, key: str, rec: Recorder, a: int, sent: dict[str, int]) -> None:
    """GROUPS groups of ROLLOUTS multi-turn chats through the gateway's scoped URLs with the
    official openai package, then each rollout's completion with a reward."""
    stream = a % 2 == 0
    with ClawClient(site, key, **rec.client_kwargs()) as claw:
        for g in range(GROUPS):
            group = f"bb{a}-g{g}"
            claw.http.post("/groups", json={"uid": group, "expected_rollouts": ROLLOUTS}).raise_for_status()
            for r in range(ROLLOUTS):
                traj = f"{group}-r{r}"
                with httpx.Client(**rec.client_kwargs()) as http:
                    client = openai.OpenAI(
                        base_url=f"{site}/t/{traj}/{group}/v1", api_key=key, http_client=http, max_retries=0
                    )
                    messages: list[dict[str, str]] = [{"role": "user", "content": f"task {group}"}]
                    for turn in range(TURNS):
                        reply = chat(client, messages, stream=stream)
                        assert reply, f"{traj} turn {turn}: empty reply"
                        messages += [
                            {"role": "assistant", "content": reply},
                            {"role": "user", "content": f"turn {turn + 1}"},
                        ]
                        sent[traj] = turn + 1
                claw.complete_trajectory(traj, reward=float(r % 2))


def chat(client: openai.OpenAI, messages: list[dict[str, str]], *, stream: bool) -> str:
    if not stream:
        out = client.chat.completions.create(model="claw-demo", messages=messages, max_tokens=8)
        return out.choices[0].message.content or ""
    chunks = client.chat.completions.create(model="claw-demo", messages=messages, max_tokens=8, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def white_box_agent(site: str, key: str, rec: Recorder, a: int, sent: dict[str, int]) -> None:
    """Whole GRPO groups through POST /api/v1/steps with exact ids and logprobs. Agent 0 puts
    its rollout's reward on the last step only and ends it with is_last (MessagePack), as
    Claw-R1's flows do: the trajectory takes it as its outcome reward; agent 1 sends the
    steps open and ends the group's rollouts in one completion call with their rewards."""
    with ClawClient(site, key, **rec.client_kwargs()) as claw:
        for g in range(GROUPS + 1):
            group = f"wb{a}-g{g}"
            claw.http.post("/groups", json={"uid": group, "expected_rollouts": ROLLOUTS}).raise_for_status()
            steps = []
            for r in range(ROLLOUTS):
                traj = f"{group}-r{r}"
                prompt = [100 + a, 200 + g, 300]
                for i in range(TURNS):
                    response = [1000 + 10 * r + i, 2000 + i]
                    last = i == TURNS - 1
                    steps.append(
                        {
                            "uid": f"{traj}:{i}",
                            "trajectory_uid": traj,
                            "prompt_group_uid": group,
                            "step_index": i,
                            "prompt_ids": prompt,
                            "response_ids": response,
                            "rollout_logprobs": [-0.5] * len(response),
                            "reward": float(r % 2) if a == 0 and last else None,
                            "is_last": last and a == 0,
                        }
                    )
                    prompt = [*prompt, *response, 400 + i]
                sent[traj] = TURNS
            result = claw.submit_steps(steps, msgpack=a == 0)
            assert result["created"] == len(steps), result
            if a == 1:
                done = claw.complete_trajectories(
                    {"uid": f"{group}-r{r}", "reward": float(r % 2)} for r in range(ROLLOUTS)
                )
                assert done == ROLLOUTS


def service(site: str, key: str, rec: Recorder) -> None:
    """An environment service: once a white-box rollout is stored, an event about it and
    feedback on its last step."""
    with ClawClient(site, key, **rec.client_kwargs()) as claw:
        for a in range(WHITE_BOX_AGENTS):
            for g in range(GROUPS + 1):
                for r in range(ROLLOUTS):
                    traj = f"wb{a}-g{g}-r{r}"
                    last = f"{traj}:{TURNS - 1}"
                    wait_for(lambda last=last: claw.http.get(f"/steps/{last}").status_code == 200, last)
                    claw.event(EVENT_TYPE, trajectory_uid=traj, payload={"passed": r})
                    claw.feedback(step_uid=last, rating=3, label=SERVICE_LABEL, comment="checked")


def reviewer(site: str, password: str, rec: Recorder, reviewed: list[str]) -> None:
    """A reviewer signs in on the pages and submits REVIEWS items of the review queue through
    its form (CSRF token and cookies as a browser would send them)."""
    with httpx.Client(base_url=site, follow_redirects=True, timeout=30, **rec.client_kwargs()) as web:
        origin = {"Origin": site}  # what a browser sends with a form POST
        page = web.get("/login/")
        page.raise_for_status()
        page = web.post(
            "/login/",
            data={"username": "rita", "password": password, "csrfmiddlewaretoken": csrf_of(page.text)},
            headers=origin,
        )
        assert page.status_code == 200 and page.url.path == "/", (page.status_code, page.url)
        while len(reviewed) < REVIEWS:
            page = wait_for(lambda: claimed(web.get("/review/")), "an item to review")
            claim = re.search(r'name="claim" value="(\d+)"', page.text)
            trajectory = re.search(r'href="/trajectories/([^/"]+)/"><code>', page.text)
            assert claim and trajectory, page.text[-2000:]
            done = web.post(
                "/review/",
                data={
                    "csrfmiddlewaretoken": csrf_of(page.text),
                    "claim": claim.group(1),
                    "item": re.search(r'name="item" value="(\d+)"', page.text).group(1),
                    "rating": "4",
                    "label": REVIEW_LABEL,
                    "comment": "fine",
                    "action": "submit",
                },
                headers=origin,
            )
            assert done.status_code == 200 and "Feedback recorded" in done.text, done.text[-2000:]
            reviewed.append(trajectory.group(1))


def claimed(page: httpx.Response) -> httpx.Response | None:
    page.raise_for_status()
    return page if 'id="review-form"' in page.text else None


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, html[-2000:]
    return found.group(1)


def trainer(site: str, key: str, rec: Recorder, name: str, stop: threading.Event, got: list[str]) -> None:
    """Pull small batches while the others write, until told to stop; each batch is acked
    when its block ends."""
    with ClawClient(site, key, **rec.client_kwargs()) as claw:
        while not stop.is_set():
            with claw.pull(DATASET, consumer=name, batch_size=2, wait=1) as batch:
                if batch:
                    assert [s["uid"] for s in batch.batch["steps"]] == batch.manifest["step_uids"]
                    got.extend(batch.manifest["step_uids"])


# --- reads -------------------------------------------------------------------------------------
def list_all(claw: ClawClient, path: str) -> list[dict]:
    """Every row of a cursor-paginated list."""
    rows: list[dict] = []
    url: str | None = f"{path}{'&' if '?' in path else '?'}page_size=1000"
    while url:
        resp = claw.http.get(url)
        resp.raise_for_status()
        body = resp.json()
        rows += body["results"]
        url = body["next"]
    return rows


def pending(claw: ClawClient, consumer: str) -> int:
    resp = claw.http.get(f"/consumers/{consumer}")
    resp.raise_for_status()
    body = resp.json()
    return sum(d["pending_units"] for d in body["datasets"] if d["dataset"] == DATASET)


def group_uids(sent: dict[str, int]) -> set[str]:
    return {t.rsplit("-r", 1)[0] for t in sent}


def uvicorn_workers(pid: int) -> list[psutil.Process]:
    """The worker processes uvicorn spawned under `serve` (multiprocessing's spawn_main)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def web_request_statuses(log: str) -> list[int]:
    """The status of every request in the web process's JSON log; a line at level ERROR or
    with a traceback counts as a 500."""
    statuses = []
    for line in log.splitlines():
        if not line.startswith("{"):
            if "Traceback" in line:
                statuses.append(500)
            continue
        entry = json.loads(line)
        if entry.get("level") in ("ERROR", "CRITICAL") or entry.get("exc_info"):
            statuses.append(500)
        elif "status" in entry:
            statuses.append(int(entry["status"]))
    return statuses
