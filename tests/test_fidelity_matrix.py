"""What a trainer receives is what the agents did: every door x every way a reward arrives x
every output, from one table.

Doors (tests/fidelity/doors.py): white-box JSON and MessagePack (``POST /api/v1/steps``
through claw_client), Claw-R1's white-box flow (``/generate`` + ``submit_steps``), and the
black-box ones, through the official SDKs against the gateway with the demo upstream behind
it: OpenAI chat (whole and streamed, a tool-using agent), Anthropic Messages, OpenAI Responses
(chained by previous_response_id) and Claw-R1's black-box flow (init, register, chat at its
base URL). Each scenario is one prompt group of two rollouts (expected_rollouts 2) of three
steps, with the group, the policy version and (white-box) the trajectory uid declared by the
source.

Reward paths (the table lists only the pairs that exist: rewards on submitted steps need a
white-box door): on every submitted step; on the last step only (Claw-R1's shape); late on
the last step (``POST /api/v1/rewards``); on the trajectory at completion; computed by the
pool's gsm8k function (the group's dataset); by a human in a review queue that sets rewards
(the review page); by Claw-R1's ``complete_trajectory``.

Outputs, of three datasets with empty filters (reward_assignment ``each_step``, the default,
``last_step`` and ``discounted_return`` with gamma 0.5): pulls in the ``steps``, ``padded`` and ``tree`` formats, the replay of each
lease, a snapshot as JSONL and as Parquet (pyarrow, and Hugging Face ``datasets``), and
``claw_client.collate_steps``.

Each delivered step must carry what its source sent (white-box) or what the upstream
produced (black-box: the upstream's request log, asked again directly for its ids and
logprobs): token ids, rollout logprobs, group, policy version, trajectory uid, step index,
and the effective reward with its scope and source (the step's own reward, else its branch's
outcome; under last_step only each branch's last step carries it, the others 0.0 with scope
"none"; under discounted_return each step its return, by hand in tests/fidelity/outputs.py),
with the two kinds apart: outcome_reward and process_reward.

Everything is written once (module-scoped), then each scenario's test compares every output
and fails with every wrong cell at once: door, reward path, outputs, row, field, expected and
got. On SQLite a slice covering every door and every reward path runs; the whole table needs
PostgreSQL (DATABASE_URL).
"""

from __future__ import annotations

import os
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq
import pytest

from claw_client import ClawClient, ClawError, collate_steps
from tests.fidelity import recording_upstream
from tests.fidelity.doors import (
    BLACK_BOX,
    LATER,
    ON_STEPS,
    Gateway,
    Rollout,
    Scenario,
    reward_arrive,
    rollout_run,
    upstream_truth,
)
from tests.fidelity.outputs import (
    GAMMA,
    Delivered,
    Key,
    compare,
    expected_rows,
    read_collated,
    read_padded,
    read_rows,
    read_steps,
    read_tree,
    report,
)
from tests.live import LiveServer, live_server, start_celery_worker, stop_process

POSTGRES = (os.environ.get("DATABASE_URL") or "").startswith("postgres")

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]

# --- the table --------------------------------------------------------------------------------
# door -> the ways its rewards can arrive.
TABLE: dict[str, tuple[str, ...]] = {
    "wb_json": (*ON_STEPS, *LATER),
    "wb_msgpack": (*ON_STEPS, *LATER),
    "clawr1_wb": (*ON_STEPS, *LATER),
    "oa_chat": LATER,
    "oa_chat_stream": LATER,
    "anthropic": LATER,
    "responses": LATER,
    "clawr1_bb": LATER,
}
# On SQLite: every door and every reward path at least once.
SQLITE_SLICE = {
    ("wb_json", "step_each"),
    ("wb_msgpack", "step_last"),
    ("clawr1_wb", "computed"),
    ("oa_chat", "trajectory"),
    ("oa_chat_stream", "late"),
    ("anthropic", "human"),
    ("responses", "trajectory"),
    ("clawr1_bb", "clawr1_complete"),
}
SCENARIOS = [
    Scenario(door, reward, index)
    for index, (door, reward) in enumerate((d, r) for d, rewards in TABLE.items() for r in rewards)
]
ACTIVE = [sc for sc in SCENARIOS if POSTGRES or (sc.door, sc.reward) in SQLITE_SLICE]
ROLLOUTS = 2
# The datasets every output is read from, by reward_assignment.
ASSIGNMENTS = {
    "each_step": {},
    "last_step": {"grouping": {"reward_assignment": "last_step"}},
    "discounted_return": {"grouping": {"reward_assignment": "discounted_return", "gamma": GAMMA}},
}
HUMAN_SOURCE = "fid-human"
REVIEW_QUEUE = "fidelity"
# Waiting for readiness (computed rewards, the worker): stop at the deadline, or once nothing
# changed for QUIET_S (a step that never becomes ready is then reported as not delivered).
READY_DEADLINE_S = 90.0
QUIET_S = 10.0


@dataclass
class World:
    rollouts: dict[str, list[Rollout]] = field(default_factory=dict)
    problems: dict[str, list[str]] = field(default_factory=dict)  # by scenario id
    outputs: dict[str, dict[str, Delivered]] = field(default_factory=dict)  # assignment -> label -> rows
    pool_state: dict[Key, str] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    """Every active scenario written once through its door, its reward arrived, then every
    output read: the live server (with a Celery worker when REDIS_URL is set, as in
    production) and the recording demo upstream."""
    tmp = tmp_path_factory.mktemp("fidelity")
    record = tmp / "upstream-requests.jsonl"
    upstream, upstream_proc = recording_upstream.start(record)
    password = secrets.token_urlsafe(16)
    queue = f"claw-fid-{uuid.uuid4().hex[:8]}"  # private: no other run's worker takes its tasks
    env = {"CLAW_UPSTREAM_URL": upstream, "CLAW_CELERY_QUEUE": queue, "CLAW_USER_PASSWORD": password}
    try:
        with live_server(tmp, env) as server:
            worker = None
            if os.environ.get("REDIS_URL"):
                worker = start_celery_worker(server.env, queue, tmp / "worker.log")
            try:
                yield _build(server, upstream, record, password, tmp)
            finally:
                if worker is not None:
                    stop_process(worker)
    finally:
        stop_process(upstream_proc)


@pytest.mark.parametrize(
    "sc",
    [
        pytest.param(
            sc,
            id=sc.id,
            marks=pytest.mark.skipif(
                sc not in ACTIVE,
                reason="the whole table runs on PostgreSQL (DATABASE_URL); SQLite runs a slice",
            ),
        )
        for sc in SCENARIOS
    ],
)
def test_what_a_trainer_receives_is_what_the_agents_did(world, sc):
    # given: the scenario's rollouts, written through its door, their reward arrived its way
    rollouts = world.rollouts.get(sc.id, [])
    labels = {ro.trajectory_uid: f"r{ro.r}" for ro in rollouts}
    problems = list(world.problems.get(sc.id, []))

    # when: every output of every dataset is read back
    by_output: dict[str, list] = {}
    for assignment, outputs in world.outputs.items():
        want = expected_rows(sc, rollouts, assignment)
        for label, got in outputs.items():
            name = f"{assignment}/{label}"
            problems += [f"[{name}] {p}" for p in got.problems]
            if got.problems and not got.rows:
                continue  # the output itself failed: said once, not once per row
            by_output[name] = compare(want, got, labels, world.pool_state)

    # then: each delivered step is what the source sent, and carries its effective reward
    lines = report(sc, by_output, problems)
    header = f"{sc.door} x {sc.reward}: trajectories " + ", ".join(f"{v}={k}" for k, v in labels.items())
    assert not lines, "\n".join([header, *lines])


# --- building the world -----------------------------------------------------------------------
def _build(server: LiveServer, upstream: str, record: Path, password: str, tmp: Path) -> World:
    w = World()
    started = time.monotonic()
    gw = Gateway(
        url=server.url,
        agent_key=server.make_key("ingest", "read", name="fid-agent"),
        human_key=server.make_key("ingest", "read", name=HUMAN_SOURCE),
        upstream=upstream,
        record=record,
    )
    trainer = server.make_key("consume", name="fid-trainer")
    admin = server.make_key("admin", name="fid-admin")
    server.manage("create_user", "--username", "fid-operator", "--role", "operator", "--noinput")
    w.timings["setup"] = time.monotonic() - started

    # when: each scenario writes its group through its door, and its reward arrives
    started = time.monotonic()
    for sc in ACTIVE:
        w.rollouts[sc.id], w.problems[sc.id] = [], []
        try:
            group = {"uid": sc.group_uid, "expected_rollouts": ROLLOUTS}
            if sc.reward == "computed":
                group.update(dataset="gsm8k", ground_truth="42")
            with gw.claw(sc) as claw:
                claw.http.post("/groups", json=group).raise_for_status()
            for r in range(ROLLOUTS):
                w.rollouts[sc.id].append(rollout_run(gw, sc, r))
            reward_arrive(gw, sc, w.rollouts[sc.id])
        except Exception as exc:  # noqa: BLE001 - reported by the scenario's test
            w.problems[sc.id].append(f"writing failed: {exc!r}")
    human = {
        ro.trajectory_uid: sc.reward_of(ro.r)
        for sc in ACTIVE
        if sc.reward == "human"
        for ro in w.rollouts[sc.id]
    }
    if human:
        try:
            _review(server.url, password, human)
        except Exception as exc:  # noqa: BLE001 - reported by the human scenarios' tests
            for sc in ACTIVE:
                if sc.reward == "human":
                    w.problems[sc.id].append(f"review failed: {exc!r}")
    w.timings["write"] = time.monotonic() - started

    # and: what the upstream produced for every black-box call
    log = recording_upstream.recorded(record)
    for sc in ACTIVE:
        if sc.door in BLACK_BOX:
            for ro in w.rollouts[sc.id]:
                if ro.calls is not None:
                    w.problems[sc.id] += upstream_truth(gw, sc, ro, log)

    # and: readiness settles (rewards computed after commit, by the worker with REDIS_URL)
    started = time.monotonic()
    expected = {
        (s.trajectory_uid, s.step_index) for ros in w.rollouts.values() for ro in ros for s in ro.steps
    }
    w.pool_state = _wait_ready(server.url, gw.agent_key, expected)
    w.timings["ready"] = time.monotonic() - started

    # then: every output of each dataset, read once
    started = time.monotonic()
    with ClawClient(server.url, admin) as claw:
        for assignment, spec in ASSIGNMENTS.items():
            name = f"fid-{assignment.replace('_', '-')}"
            try:
                claw.create_dataset(name, filters={}, **spec)
            except ClawError as exc:
                w.outputs[assignment] = {
                    "dataset": Delivered(problems=[f"dataset {spec or '{}'} refused: {exc}"])
                }
                continue
            w.outputs[assignment] = _outputs(server.url, trainer, name, tmp)
    w.timings["outputs"] = time.monotonic() - started
    print(f"fidelity matrix: {len(ACTIVE)} scenarios, timings {w.timings}")
    return w


def _review(url: str, password: str, rewards: dict[str, float]) -> None:
    """An operator signs in, creates a review queue that turns ratings into rewards over the
    human source's trajectories (the review queues page), and rates each trajectory on the
    review page so that its reward is ``rewards[uid]`` (rating 1..5 -> 0..1)."""
    origin = {"Origin": url}
    with httpx.Client(base_url=url, follow_redirects=True, timeout=30) as web:
        page = web.get("/login/")
        page = web.post(
            "/login/",
            data={"username": "fid-operator", "password": password, "csrfmiddlewaretoken": _csrf(page.text)},
            headers=origin,
        )
        assert page.status_code == 200 and page.url.path == "/", (page.status_code, page.url)
        page = web.get("/review/queues/")
        page = web.post(
            "/review/queues/",
            data={
                "csrfmiddlewaretoken": _csrf(page.text),
                "name": REVIEW_QUEUE,
                "description": "fidelity matrix",
                "dataset": "",
                # the queue's scope, chosen with the dataset builder's fields
                "readiness": "any",
                "sources": HUMAN_SOURCE,
                "rating_min": "1",
                "rating_max": "5",
                "label_choices": "",
                "sets_reward": "on",
            },
            headers=origin,
        )
        assert page.status_code == 200 and page.url.path == f"/review/{REVIEW_QUEUE}/", page.text[-2000:]
        for _ in rewards:
            page = web.get(f"/review/{REVIEW_QUEUE}/")
            claim = re.search(r'name="claim" value="(\d+)"', page.text)
            traj = re.search(r'href="/trajectories/([^/"]+)/"><code>', page.text)
            traj_id = re.search(r'name="item" value="(\d+)"', page.text)
            assert claim and traj and traj_id, page.text[-2000:]
            done = web.post(
                f"/review/{REVIEW_QUEUE}/",
                data={
                    "csrfmiddlewaretoken": _csrf(page.text),
                    "claim": claim.group(1),
                    "item": traj_id.group(1),
                    "rating": str(1 + 4 * rewards[traj.group(1)]),
                    "label": "",
                    "comment": "fidelity",
                    "action": "submit",
                },
                headers=origin,
            )
            assert done.status_code == 200 and "Feedback recorded" in done.text, done.text[-2000:]


def _csrf(html: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert found, html[-2000:]
    return found.group(1)


def _wait_ready(url: str, key: str, expected: set[Key]) -> dict[Key, str]:
    """Poll the pool until every expected step is ready (or nothing changes for QUIET_S, or
    READY_DEADLINE_S passes); returns what the pool says of each step, for the report."""
    deadline = time.monotonic() + READY_DEADLINE_S
    last_change, seen = time.monotonic(), None
    with ClawClient(url, key) as claw:
        while True:
            steps = _all_steps(claw)
            state = {
                (s["trajectory_uid"], s["step_index"]): (
                    f"in the pool: ready={s['ready']}, readiness={s['readiness']}, "
                    f"reward={s['reward']}, reward_status={s['reward_status']}"
                )
                for s in steps
            }
            ready = {(s["trajectory_uid"], s["step_index"]) for s in steps if s["ready"]}
            now = time.monotonic()
            if expected <= ready or now > deadline or (state == seen and now - last_change > QUIET_S):
                return state
            if state != seen:
                seen, last_change = state, now
            time.sleep(0.5)


def _all_steps(claw: ClawClient) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    page: str | None = "/steps?page_size=1000"
    while page:
        body = claw.http.get(page).raise_for_status().json()
        rows += body["results"]
        page = body["next"]
    return rows


def _outputs(url: str, trainer: str, dataset: str, tmp: Path) -> dict[str, Delivered]:
    """Every output of ``dataset``: a pull per format (each by its own consumer, so each
    gets every ready group) and its lease's replay, collate_steps of the steps pull, and a
    snapshot's files."""
    out: dict[str, Delivered] = {}
    readers = {"steps": read_steps, "padded": read_padded, "tree": read_tree}
    with ClawClient(url, trainer) as claw:
        for fmt, reader in readers.items():
            batch = claw.pull(dataset, consumer=f"{dataset}-{fmt}", batch_size=4096, format=fmt)
            out[fmt] = reader(batch.batch)
            if not batch:
                continue
            replayed = claw.replay(batch.lease_id)
            out[f"replay.{fmt}"] = reader(orjson.loads(replayed)["batch"])
            if replayed != batch.raw:
                out[f"replay.{fmt}"].problems.append("the replay is not the pull's answer byte for byte")
            if fmt == "steps":
                keys = {s["uid"]: (s["trajectory_uid"], s["step_index"]) for s in batch.batch["steps"]}
                out["collate"] = read_collated(collate_steps(batch), keys)
            batch.ack()
        out.update(_snapshot(claw, dataset, tmp))
    return out


def _snapshot(claw: ClawClient, dataset: str, tmp: Path) -> dict[str, Delivered]:
    """A snapshot of ``dataset``: its JSONL lines, its Parquet read by pyarrow and by
    Hugging Face datasets."""
    labels = ("snapshot.jsonl", "snapshot.parquet", "snapshot.hf-datasets")
    try:
        snap = claw.http.post("/snapshots", json={"dataset": dataset}).raise_for_status().json()
        deadline = time.monotonic() + 120
        while snap["status"] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.25)
            snap = claw.http.get(f"/snapshots/{snap['id']}").raise_for_status().json()
        if snap["status"] != "done":
            raise AssertionError(f"snapshot {snap['id']} is {snap['status']}: {snap['error']}")
        files = {}
        for fmt in ("jsonl", "parquet"):
            path = tmp / f"{dataset}.{fmt}"
            resp = claw.http.get(f"/snapshots/{snap['id']}/download", params={"format": fmt})
            path.write_bytes(resp.raise_for_status().content)
            files[fmt] = path
    except Exception as exc:  # noqa: BLE001 - reported by every scenario's test
        return {label: Delivered(problems=[f"snapshot failed: {exc!r}"]) for label in labels}
    offline = os.environ.get("HF_DATASETS_OFFLINE")
    os.environ["HF_DATASETS_OFFLINE"] = "1"  # a local file: never the Hub
    try:
        import datasets

        loaded = datasets.load_dataset(
            "parquet", data_files=str(files["parquet"]), split="train", cache_dir=str(tmp / "hf")
        )
    finally:
        if offline is None:
            os.environ.pop("HF_DATASETS_OFFLINE")
        else:
            os.environ["HF_DATASETS_OFFLINE"] = offline
    return {
        labels[0]: read_rows([orjson.loads(line) for line in files["jsonl"].read_bytes().splitlines()]),
        labels[1]: read_rows(pq.read_table(files["parquet"]).to_pylist()),
        labels[2]: read_rows(loaded.to_list()),
    }
