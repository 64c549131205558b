"""The live dashboard websocket end to end: the real ASGI application (session auth),
the real write path (HTTP API and services), the configured channel layer (in-memory, or
Redis with REDIS_URL) and the publisher's flusher thread. Committed transactions
(transaction=True): events are published after the commit."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from channels.db import database_sync_to_async as sync_to_async
from django.conf import settings
from django.contrib.auth.models import Permission
from django.db import connection

from curation import consumers
from curation.services.consume import PullIn, consumer_pull, lease_ack
from curation.services.datasets import dataset_create
from curation.services.snapshots import snapshot_build, snapshot_create
from pool.models import PromptGroup
from pool.services.merge import group_merge_compute
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.service_events import feedback_create
from tests.conftest import client_for, make_step, post_steps
from tests.curation.test_consume import ready_group
from tests.live_events.conftest import DEADLINE, socket, total, until

pytestmark = pytest.mark.django_db(transaction=True)


async def closed_with(comm) -> int:
    msg = await comm.receive_output(timeout=DEADLINE)
    while msg["type"] != "websocket.close":  # a batch already on its way may come first
        msg = await comm.receive_output(timeout=DEADLINE)
    return msg["code"]


async def test_anonymous_is_closed_with_4401():
    async with socket(None) as comm:
        assert await closed_with(comm) == 4401


async def test_a_user_without_the_permission_is_closed_with_4403(nobody):
    async with socket(nobody) as comm:
        assert await closed_with(comm) == 4403


async def test_an_unknown_topic_is_refused(viewer):
    async with socket(viewer, topics="overview,secrets") as comm:
        assert await closed_with(comm) == 4400


async def test_a_topic_needing_another_permission_is_refused(viewer):
    async with socket(viewer, topics="overview,curation") as comm:  # curation: change_step
        assert await closed_with(comm) == 4403


async def test_hello_carries_the_current_state(viewer, agent_key):
    # given two trajectories, one completed, stored through the API
    agent = client_for(agent_key)
    steps = [make_step("h1", 0), make_step("h1", 1, is_last=True), make_step("h2", 0, group="g2")]
    assert (await sync_to_async(post_steps)(agent, steps)).status_code == 201
    # when a viewer connects
    async with socket(viewer, topics="overview") as comm:
        hello = await comm.receive_json_from(timeout=DEADLINE)
    # then the hello state counts them
    assert hello["type"] == "hello"
    state = hello["state"]
    assert state["collect"]["steps"] == 3
    assert state["collect"]["trajectories"] == 2
    assert state["collect"]["running"] == 1
    (source,) = state["collect"]["sources"]
    assert source["name"] == "agent" and source["steps"] == 3 and source["last_seen"]
    assert state["represent"] == {"exact": 3, "retokenized": 0, "drift": 0}
    assert set(state) == {
        "collect",
        "represent",
        "curate",
        "optimize",
        "consume",
        "quality",
        "policy_version",
    }
    assert state["consume"] == {"leases_open": 0, "acked": 0, "consumers": 0}


async def test_a_topic_gets_only_its_state(viewer):
    async with socket(viewer, topics="optimization") as comm:
        hello = await comm.receive_json_from(timeout=DEADLINE)
    assert set(hello["state"]) == {"optimize", "policy_version"}


async def test_a_step_submitted_through_the_api_arrives_as_a_steps_event(viewer, agent_key):
    agent = client_for(agent_key)
    async with socket(viewer, topics="collection") as comm:
        await comm.receive_json_from(timeout=DEADLINE)  # hello
        # when two steps of one trajectory, the second its last, are submitted
        steps = [make_step("e1", 0), make_step("e1", 1, is_last=True)]
        assert (await sync_to_async(post_steps)(agent, steps)).status_code == 201
        events = await until(
            comm, lambda ev: total(ev, "steps") >= 2 and total(ev, "trajectories.completed") >= 1
        )
    # then the steps event counts them, names the source and lists them
    (steps_event,) = [e["data"] for e in events if e["kind"] == "steps"]
    assert steps_event["count"] == 2
    assert steps_event["by_source"] == {"agent": 2}
    assert steps_event["drift"] == 0
    assert [s["uid"] for s in steps_event["recent"]] == ["e1-s0", "e1-s1"]
    assert steps_event["recent"][0]["trajectory"] == "e1"
    assert steps_event["recent"][0]["token_source"] == "client"
    # with each step's token counts (the live /steps/ rows show them), the ones submitted
    assert [(s["prompt_len"], s["response_len"]) for s in steps_event["recent"]] == [
        (len(st["prompt_ids"]), len(st["response_ids"])) for st in steps
    ]
    (traj,) = steps_event["trajectories"]
    assert traj["uid"] == "e1" and traj["status"] == "completed" and traj["step_count"] == 2
    assert traj["source"] == "agent" and traj["channel"] == "train" and traj["group"] == "g1"
    (completed,) = [e["data"] for e in events if e["kind"] == "trajectories.completed"]
    assert completed["count"] == 1 and completed["items"][0]["uid"] == "e1"
    assert completed["items"][0]["group"] == "g1"  # the group's uid, as the pages name it


async def test_a_burst_of_500_steps_arrives_in_a_few_coalesced_batches(viewer, agent_key):
    agent = client_for(agent_key)
    writes = 100  # of 5 steps each

    took: list[float] = []

    def burst() -> None:
        try:
            start = time.monotonic()
            for w in range(writes):
                resp = post_steps(agent, [make_step(f"b{w}", i, group=None) for i in range(5)])
                assert resp.status_code == 201, resp.content
            took.append(time.monotonic() - start)
        finally:
            connection.close()  # this thread's own connection

    async with socket(viewer, topics="steps") as comm:
        await comm.receive_json_from(timeout=DEADLINE)  # hello
        thread = threading.Thread(target=burst)
        thread.start()
        # the writes take what the machine allows; the deadline runs from their end (the
        # consumer keeps delivering meanwhile: this loop is free while the thread runs)
        await sync_to_async(thread.join)()
        events = await until(comm, lambda ev: total(ev, "steps") >= 500)
    # then every step is counted exactly once, in at most one message per tick of the
    # burst (coalesced: far fewer than writes when the writes come faster than the ticks)
    assert total(events, "steps") == 500 and took
    messages = {e["message"] for e in events if e["kind"] == "steps"}
    ticks = took[0] / (settings.CLAW_LIVE_TICK_MS / 1000)
    assert len(messages) <= min(writes, int(ticks) + 2), (len(messages), ticks)
    # and the capped lists hold the latest entries
    last = [e["data"] for e in events if e["kind"] == "steps"][-1]
    assert len(last["recent"]) <= 20 and last["recent"][-1]["uid"] == f"b{writes - 1}-s4"


async def test_a_revoked_permission_closes_the_socket_with_4403(viewer, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0)  # re-check on every batch
    async with socket(viewer, topics="overview") as comm:
        await comm.receive_json_from(timeout=DEADLINE)  # hello
        # when the permission is removed and the next event comes
        await sync_to_async(_revoke)(viewer, "view_trajectory")
        await sync_to_async(_publish_feedback)()
        # then the batch is not delivered: the socket closes with 4403
        assert await _closed_without_feedback(comm) == 4403


async def test_a_deactivated_user_is_closed_with_4403(viewer, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.0)
    async with socket(viewer, topics="overview") as comm:
        await comm.receive_json_from(timeout=DEADLINE)
        viewer.is_active = False
        await sync_to_async(viewer.save)()
        await sync_to_async(_publish_feedback)()
        assert await _closed_without_feedback(comm) == 4403


async def _closed_without_feedback(comm) -> int:
    """The close code the socket ends with. Messages queued before the permission changed
    (the rate of earlier tests' writes, say) may come first; the feedback published after
    the change never does."""
    deadline = time.monotonic() + DEADLINE
    while True:
        msg = await comm.receive_output(timeout=max(deadline - time.monotonic(), 0.01))
        if msg["type"] == "websocket.close":
            return msg["code"]
        assert '"feedback"' not in msg.get("text", ""), msg


def _revoke(user, codename: str) -> None:
    user.user_permissions.remove(Permission.objects.get(codename=codename))


def _publish_feedback() -> None:
    from pool.live import publish

    publish("feedback", {"count": 1})


async def test_rewards_feedback_readiness_and_merge_events_arrive(viewer):
    async with socket(viewer, topics="overview") as comm:
        await comm.receive_json_from(timeout=DEADLINE)
        # a ready group (its steps rewarded at ingest), a reward, feedback, a merge
        uids = await sync_to_async(ready_group)("rg", rollouts=2, steps=2)
        await sync_to_async(rewards_apply)(rewards=[RewardIn(reward=0.5, step_uid=uids[0])])
        await sync_to_async(feedback_create)(step_uid=uids[1], rating=1.0)
        gid = await sync_to_async(lambda: PromptGroup.objects.get(uid="rg").id)()
        await sync_to_async(group_merge_compute)(group_id=gid)
        events = await until(
            comm,
            lambda ev: (
                total(ev, "rewards") >= 1
                and total(ev, "feedback") >= 1
                and total(ev, "readiness", "ready_groups") >= 1
                and any(e["kind"] == "merge" for e in ev)
            ),
        )
    assert total(events, "rewards") == 1
    assert total(events, "feedback") == 1
    assert total(events, "readiness", "ready_groups") == 1
    assert total(events, "readiness", "ready_steps") == 4
    merge = [item for e in events if e["kind"] == "merge" for item in e["data"]["items"]]
    assert merge[-1]["group"] == "rg" and merge[-1]["tokens"] > 0 and merge[-1]["tokens_saved"] >= 0


async def test_lease_and_snapshot_events_arrive(viewer):
    await sync_to_async(dataset_create)(name="all")
    await sync_to_async(ready_group)("lg", rollouts=2, steps=2)
    async with socket(viewer, topics="consumption") as comm:
        await comm.receive_json_from(timeout=DEADLINE)
        lease = await sync_to_async(consumer_pull)(consumer="c1", pull=PullIn(dataset="all"))
        await sync_to_async(lease_ack)(lease_id=lease.id)
        snap = await sync_to_async(snapshot_create)(dataset="all")
        await sync_to_async(snapshot_build)(snapshot_id=snap.id)
        events = await until(
            comm,
            lambda ev: (
                total(ev, "lease", "taken") >= 1
                and total(ev, "lease", "acked") >= 1
                and any(e["kind"] == "snapshot" and e["data"]["status"] == "done" for e in ev)
            ),
        )
    items = [i for e in events if e["kind"] == "lease" for i in e["data"]["items"]]
    assert items[0]["id"] == str(lease.id) and items[0]["consumer"] == "c1" and items[0]["steps"] == 4
    done = [e["data"] for e in events if e["kind"] == "snapshot"][-1]
    assert done == {"id": str(snap.id), "status": "done", "progress": 1.0, "steps": 4}


async def test_a_snapshot_topic_gets_its_progress(viewer):
    await sync_to_async(dataset_create)(name="all")
    await sync_to_async(ready_group)("sg", rollouts=2, steps=2)
    snap = await sync_to_async(snapshot_create)(dataset="all")
    async with socket(viewer, topics=f"snapshot.{snap.id}") as comm:
        await comm.receive_json_from(timeout=DEADLINE)
        await sync_to_async(snapshot_build)(snapshot_id=snap.id, chunk_size=1)
        events = await until(comm, lambda ev: any(e["data"].get("status") == "done" for e in ev))
    progress = [e["data"]["progress"] for e in events if e["kind"] == "snapshot"]
    assert progress == sorted(progress) and progress[-1] == 1.0


async def test_a_close_while_the_channel_layer_is_away_ends_cleanly(viewer, monkeypatch, caplog):
    # given: a connected socket, and a channel layer that times out (Redis away) from now on
    from channels.layers import get_channel_layer

    async def away(self, group, channel):
        raise TimeoutError("the channel layer did not answer")

    monkeypatch.setattr(consumers.log, "handlers", [*consumers.log.handlers])  # restored after
    consumers.log.addHandler(caplog.handler)  # the site's logging config may not propagate it
    async with socket(viewer, topics="overview") as comm:
        await comm.receive_json_from(timeout=DEADLINE)  # hello
        monkeypatch.setattr(type(get_channel_layer()), "group_discard", away)
        # when: the browser closes the socket (the context's exit awaits the consumer's end,
        # and re-raises whatever the application raised)
    # then: the close ended without an exception in the application, and the failed leave is
    # logged as a warning naming the topic
    assert any("leaving overview at close failed" in r.getMessage() for r in caplog.records)


class _Errors(logging.Handler):
    """Records at WARNING and above, on the root logger (caplog's handler does not survive the
    ASGI app's import, which configures logging anew)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# (case, topics as the query string sends them)
BAD_TOPICS = [
    ("a 5,000-character topic", "x" * 5000),
    ("a known topic and a 5,000-character one", "overview," + "y" * 5000),
    ("a 200-character topic", "z" * 200),
    ("a NUL in the topic", "over%00view"),
    ("U+2028 in the topic", "overview%E2%80%A8"),
]


@pytest.mark.parametrize(("case", "topics"), BAD_TOPICS, ids=[c for c, _ in BAD_TOPICS])
async def test_a_bad_topic_closes_4400_and_logs_no_error(viewer, case, topics):
    import claw_site.asgi  # noqa: F401 - loaded before the handler is attached

    errors = _Errors()
    logging.getLogger().addHandler(errors)
    try:
        # when a socket asks for the topic
        async with socket(viewer, topics=topics) as comm:
            # then it is closed with 4400 ...
            assert await closed_with(comm) == 4400
        # ... and nothing was logged at WARNING or above (no traceback, no "Exception in ASGI")
        assert [r.getMessage() for r in errors.records] == []
    finally:
        logging.getLogger().removeHandler(errors)
