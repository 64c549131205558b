"""The live counters stay true: the hello state is the API's numbers, and after events the
consumer sends the counters read again ("state"), equal to a fresh snapshot and to the API,
including writes that publish no event; one read serves every dashboard of a process. Live
items name prompt groups by uid. The real ASGI application, write path and channel layer,
committed transactions (see test_consumer.py)."""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import sync_to_async

from curation import consumers
from curation.selectors.live import live_state
from tests.conftest import client_for, make_step, post_steps
from tests.dashboard.traffic import EXPECTED, api_numbers, consistent, drive, state_numbers
from tests.live_events.conftest import (
    DEADLINE,
    in_thread,
    session_cookie,
    socket,
    state_until,
    total,
    until,
)

pytestmark = pytest.mark.django_db(transaction=True)


async def test_the_hello_state_is_the_apis_numbers(viewer, agent_key, trainer_key, reader_key):
    # given real traffic
    await in_thread(drive)(client_for(agent_key), client_for(trainer_key))
    want = await in_thread(api_numbers)(client_for(reader_key))
    # when a viewer connects
    async with socket(viewer, topics="overview") as comm:
        hello = await comm.receive_json_from(timeout=DEADLINE)
    # then the hello state is the API's numbers
    assert hello["type"] == "hello"
    assert state_numbers(hello["state"]) == want
    assert {k: want[k] for k in EXPECTED} == EXPECTED


async def test_after_events_the_counters_are_a_fresh_snapshot(viewer, agent_key, trainer_key, reader_key):
    async with socket(viewer, topics="overview") as comm:
        hello = await comm.receive_json_from(timeout=DEADLINE)
        assert state_numbers(hello["state"])["collect.steps"] == 0
        # when the traffic runs while the page is open
        await in_thread(drive)(client_for(agent_key), client_for(trainer_key))
        want = await in_thread(api_numbers)(client_for(reader_key))
        # then a state message brings the API's numbers, consistent with each other
        state, events = await state_until(comm, lambda s: state_numbers(s) == want)
        # the events that moved them may still be on their way when the counters' state is
        # read (the publisher coalesces them): wait for those of the traffic's trajectories
        if not _all_seen(events):
            events += await until(comm, lambda more: _all_seen(events + more))
    consistent(state_numbers(state))
    assert {k: want[k] for k in EXPECTED} == EXPECTED
    # and it is what a fresh snapshot reads now
    assert state == await in_thread(live_state)(["overview"])
    # and the events that moved them name the prompt group by its uid
    touched, completed = _touched(events), _completed(events)
    assert touched["g-r0"] == touched["g-r1"] == "g" and touched["run"] is None
    assert completed["g-r0"] == completed["g-r1"] == "g" and completed["unrewarded"] is None


def _touched(events: list[dict]) -> dict:
    return {t["uid"]: t["group"] for e in events if e["kind"] == "steps" for t in e["data"]["trajectories"]}


def _completed(events: list[dict]) -> dict:
    return {
        t["uid"]: t["group"]
        for e in events
        if e["kind"] == "trajectories.completed"
        for t in e["data"]["items"]
    }


def _all_seen(events: list[dict]) -> bool:
    return {"g-r0", "g-r1", "run"} <= _touched(events).keys() and {
        "g-r0",
        "g-r1",
        "unrewarded",
    } <= _completed(events).keys()


async def test_a_write_that_publishes_no_event_shows_at_the_next_idle_read(viewer, agent_key, monkeypatch):
    monkeypatch.setattr(consumers, "IDLE_REFRESH_SECONDS", 0.2)
    agent = client_for(agent_key)
    async with socket(viewer, topics="overview") as comm:
        hello = (await comm.receive_json_from(timeout=DEADLINE))["state"]
        # when a trajectory is opened through the API (no live event for it)
        resp = await in_thread(agent.post)("/api/v1/trajectories", {"uid": "opened"}, format="json")
        assert resp.status_code == 201, resp.content
        # then the counters count it, without any batch
        state, events = await state_until(comm, lambda s: s["collect"]["trajectories"] == 1)
    assert hello["collect"]["trajectories"] == 0
    assert state["collect"]["running"] == 1
    assert [e for e in events if e["kind"] != "rate"] == []  # (rate: the flusher's, of earlier steps)


async def test_one_read_serves_every_dashboard_of_a_process(viewer, agent_key, monkeypatch):
    reads: list[tuple[str, ...]] = []

    def counted(topics):
        reads.append(tuple(topics))
        return live_state(topics)

    monkeypatch.setattr(consumers, "live_state", counted)
    agent = client_for(agent_key)
    cookie = await sync_to_async(session_cookie)(viewer)  # one sign-in, before either connects
    async with (
        socket(topics="overview", cookie=cookie) as a,
        socket(topics="overview,collection", cookie=cookie) as b,
    ):
        for comm in (a, b):
            await comm.receive_json_from(timeout=DEADLINE)  # hello: one read each
        assert len(reads) == 2
        # when a step is written
        steps = [make_step("one", 0, group="grp-one")]
        assert (await in_thread(post_steps)(agent, steps)).status_code == 201
        # then both dashboards get the new counters, from one read
        got = await asyncio.gather(*(state_until(c, lambda s: s["collect"]["steps"] == 1) for c in (a, b)))
    assert len(reads) == 3
    assert got[0][0] == got[1][0]
    # and the collection item names the group by its uid (b hears it on both its topics)
    items = {
        (t["uid"], t["group"]) for e in got[1][1] if e["kind"] == "steps" for t in e["data"]["trajectories"]
    }
    assert items == {("one", "grp-one")}


async def test_a_completion_through_the_api_names_the_group_by_uid(viewer, agent_key):
    agent = client_for(agent_key)
    assert (await in_thread(post_steps)(agent, [make_step("c1", 0, group="grp-c")])).status_code == 201
    async with socket(viewer, topics="collection") as comm:
        await comm.receive_json_from(timeout=DEADLINE)
        resp = await in_thread(agent.post)("/api/v1/trajectories/c1/complete", {"reward": 1.0}, format="json")
        assert resp.status_code == 200, resp.content
        events = await until(comm, lambda ev: total(ev, "trajectories.completed") >= 1)
    (item,) = [i for e in events if e["kind"] == "trajectories.completed" for i in e["data"]["items"]]
    assert item == {
        "uid": "c1",
        "source": "agent",
        "channel": "train",
        "status": "completed",
        "step_count": 1,
        "group": "grp-c",
    }
