"""The publisher's coalescing (pool/live.py): exact counts, capped lists, latest states."""

from __future__ import annotations

from pool import live


def steps_event(n: int, start: int, source: str = "agent") -> dict:
    return {
        "count": n,
        "by_source": {source: n},
        "drift": 1,
        "trajectories": [{"uid": f"t{start + i}", "step_count": 1} for i in range(n)],
        "recent": [{"uid": f"s{start + i}"} for i in range(n)],
    }


def test_steps_events_of_a_tick_merge_into_one_per_topic():
    # given 30 writes of 5 steps from two sources, on the collection topic (and overview)
    raw = [
        ("steps", steps_event(5, 5 * w, "a" if w % 2 else "b"), ("overview", "collection")) for w in range(30)
    ]
    # when they are coalesced
    batches = dict(live.coalesce(raw))
    # then each topic gets one steps event with exact counts and the latest entries
    assert set(batches) == {"overview", "collection"}
    (event,) = batches["collection"]
    data = event["data"]
    assert event["kind"] == "steps"
    assert data["count"] == 150 and data["drift"] == 30
    assert data["by_source"] == {"a": 75, "b": 75}
    assert [s["uid"] for s in data["recent"]] == [f"s{i}" for i in range(130, 150)]
    assert [t["uid"] for t in data["trajectories"]] == [f"t{i}" for i in range(100, 150)]
    assert batches["overview"] == batches["collection"]


def test_a_trajectory_touched_twice_is_listed_once_with_its_latest_state():
    first = dict(steps_event(1, 0), trajectories=[{"uid": "t", "step_count": 1}])
    second = dict(steps_event(1, 1), trajectories=[{"uid": "t", "step_count": 2}])
    ((_, (event,)),) = live.coalesce([("steps", first, ("steps",)), ("steps", second, ("steps",))])
    assert event["data"]["trajectories"] == [{"uid": "t", "step_count": 2}]


def test_counts_add_up_items_are_capped_and_snapshots_keep_their_latest_state():
    raw = [
        ("rewards", {"count": 3}, ("overview",)),
        ("rewards", {"count": 4}, ("overview",)),
        ("readiness", {"ready_steps": 8, "ready_groups": 1}, ("overview",)),
        ("readiness", {"ready_steps": 16, "ready_groups": 2}, ("overview",)),
        *[("lease", {"taken": 1, "acked": 0, "items": [{"id": i}]}, ("overview",)) for i in range(60)],
        ("snapshot", {"id": "a", "status": "building", "progress": 0.5, "steps": 5}, ("overview",)),
        ("snapshot", {"id": "b", "status": "pending", "progress": 0.0, "steps": 0}, ("overview",)),
        ("snapshot", {"id": "a", "status": "done", "progress": 1.0, "steps": 10}, ("overview",)),
    ]
    ((topic, events),) = live.coalesce(raw)
    by_kind: dict[str, list[dict]] = {}
    for e in events:
        by_kind.setdefault(e["kind"], []).append(e["data"])
    assert by_kind["rewards"] == [{"count": 7}]
    assert by_kind["readiness"] == [{"ready_steps": 24, "ready_groups": 3}]
    (lease,) = by_kind["lease"]
    assert lease["taken"] == 60 and [i["id"] for i in lease["items"]] == list(range(10, 60))
    assert by_kind["snapshot"] == [
        {"id": "a", "status": "done", "progress": 1.0, "steps": 10},
        {"id": "b", "status": "pending", "progress": 0.0, "steps": 0},
    ]
