"""The one effects registry, the bus (pool/bus.py): filled by the apps' ready(), the only
place live events and follow-up tasks come from, one home for a trajectory's ending."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from curation import events as curation_events
from curation import tasks as curation_tasks
from curation.services import counts
from curation.services.labels import steps_label
from pool import bus, live, tasks
from pool.bus import LabelsSet, StepsWritten, TrajectoriesEnded
from pool.ingest import effects
from pool.ingest.pipeline import steps_ingest
from pool.models import Step
from pool.services import groups, readiness, rewards, trajectories
from pool.services.trajectories import trajectory_complete
from tests.pool.factories import step_in

ROOT = Path(__file__).resolve().parents[2]
PROMPT = list(range(100, 140))


@contextmanager
def seen(event_type: type) -> Iterator[list]:
    """The events of ``event_type`` emitted meanwhile (a registered effect records them)."""
    got: list = []
    bus.register(got.append, event_type)
    try:
        yield got
    finally:
        bus.unregister(got.append)


def test_the_apps_ready_register_every_effect_once_in_order():
    # given: Django set up (the apps' ready() ran)
    # then: the pool's effects of stored steps, in the order the docstring numbers them
    assert bus._registry[StepsWritten][:7] == [
        effects.trajectory_counters,
        effects.group_anchors,
        rewards.steps_written_rewards,
        readiness.steps_written_settle,
        groups.steps_written_groups,
        live.steps_written,
        trajectories.steps_written_ended,
    ]
    # and the follow-ups of the other events, each from its own app
    assert bus._registry[TrajectoriesEnded] == [
        tasks.trajectories_ended_enqueue,
        live.trajectories_ended,
        counts.trajectories_ended,
    ]
    assert bus._registry[bus.GroupsCompleted] == [
        readiness.groups_completed_settle,
        tasks.groups_completed_enqueue,
        counts.groups_completed,
    ]
    # and the counts kept per saved dataset follow every write that changes what one admits
    assert bus._registry[StepsWritten][-1] == counts.steps_written
    for event in (bus.GroupsReady, bus.RewardsSet, LabelsSet, bus.FeedbackRecorded, bus.UnitsChanged):
        assert bus._registry[event][-1].__module__ == counts.__name__, event
    assert bus._registry[curation_events.DatasetVersionCurrent] == [curation_tasks.dataset_count_enqueue]
    assert bus._registry[curation_events.SnapshotRequested] == [curation_tasks.snapshot_build_enqueue]
    assert bus._registry[curation_events.SnapshotChanged] == [curation_events.snapshot_live]
    assert bus._registry[curation_events.LeaseChanged] == [curation_events.lease_live]
    # and none of the pool's own effects makes a fused append open a transaction
    assert not bus.any_registered()


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth, relative ones resolved to their package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


SERVICES = sorted([*ROOT.glob("pool/services/*.py"), *ROOT.glob("curation/services/*.py")])


@pytest.mark.parametrize("path", SERVICES, ids=lambda p: str(p.relative_to(ROOT)))
def test_services_never_import_tasks_nor_the_live_notifier(path):
    # then: a service emits events; the tasks it makes necessary and its live events are
    # effects registered by the apps
    imported = _imports(path)
    assert not imported & {"pool.tasks", "curation.tasks", "pool.live", "pool.live.publish"}


def _module_graph() -> dict[str, set[str]]:
    """Import edges between the modules of pool/ and curation/ (at any depth: a lazy import
    is an edge too), but for AppConfig.ready(), which runs after every module is loaded, and
    a package's re-exports of its own submodules."""
    modules = {}
    for p in [*ROOT.glob("pool/**/*.py"), *ROOT.glob("curation/**/*.py")]:
        if "migrations" not in p.parts and p.name != "apps.py":
            parts = p.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return {
        name: {m for m in _imports(p) if m in modules and m != name and not m.startswith(name + ".")}
        for name, p in modules.items()
    }


def test_services_tasks_and_effects_import_in_no_circle():
    # given: the import graph of the write services, the tasks, the registry and the notifier
    graph = _module_graph()
    mine = [
        m
        for m in graph
        if m.startswith(("pool.services", "curation.services"))
        or m
        in {"pool.tasks", "curation.tasks", "pool.bus", "pool.ingest.effects", "pool.live", "curation.events"}
    ]
    # then: none of them reaches itself again
    for start in mine:
        seen_: set[str] = set()
        todo = list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself through {sorted(seen_)}"
            if m not in seen_:
                seen_.add(m)
                todo.extend(graph[m])


def test_the_registry_imports_no_service_task_or_notifier():
    # the bus imports nothing of the pool; the ingest's own effects only the bus, models, SQL
    assert {m for m in _imports(ROOT / "pool/bus.py") if m.startswith("pool")} == set()
    imported = _imports(ROOT / "pool/ingest/effects.py")
    assert {m for m in imported if m.startswith("pool.")} <= {
        "pool.bus",
        "pool.bus.StepsWritten",
        "pool.models",
        "pool.models.PromptGroup",
        "pool.sql",
    }


def test_live_events_are_published_only_by_registered_effects():
    # then: outside the notifier, only the modules of registered effects send live events
    senders = {
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("pool/**/*.py"), *ROOT.glob("curation/**/*.py"), *ROOT.glob("gateway/**/*.py")]
        if any(
            isinstance(n, ast.Attribute)
            and n.attr in ("publish", "send")
            and getattr(n.value, "id", "") == "live"
            for n in ast.walk(ast.parse(p.read_text()))
        )
    }
    assert senders == {"curation/events.py"}


def test_every_task_shares_the_one_retry_definition():
    for task in (
        tasks.group_merge,
        tasks.groups_merge,
        tasks.steps_merge,
        tasks.trajectory_rewards_compute,
        tasks.group_rewards_compute,
        tasks.groups_rewards_compute,
        tasks.counters_compact,
        tasks.outbox_relay,
        tasks.readiness_sweep,
        curation_tasks.leases_expire,
        curation_tasks.snapshot_build,
    ):
        assert task.autoretry_for == tasks.RETRY["autoretry_for"]
        assert (task.retry_backoff, task.retry_backoff_max, task.max_retries) == (True, 300, 5)


@pytest.mark.django_db(transaction=True)
def test_a_label_goes_through_the_pool_service_and_is_an_event():
    # given: two steps
    steps_ingest(
        steps=[step_in("lb", 0, prompt=PROMPT, response=[1]), step_in("lb", 1, prompt=PROMPT, response=[2])]
    )
    ids = sorted(Step.objects.values_list("id", flat=True))
    # when: both are accepted, then again (nothing changes the second time)
    with seen(LabelsSet) as got:
        steps_label(step_ids=ids, actor="op", label=Step.Label.ACCEPTED)
        steps_label(step_ids=ids, actor="op", label=Step.Label.ACCEPTED)
    # then: one event for the one change
    assert got == [LabelsSet(step_ids=tuple(ids), label=Step.Label.ACCEPTED)]
    assert set(Step.objects.values_list("label", flat=True)) == {Step.Label.ACCEPTED}


@pytest.mark.django_db(transaction=True)
def test_ending_a_trajectory_is_one_event_from_either_door():
    # when: one trajectory ends by its last step (no reward), another by an explicit completion
    with seen(TrajectoriesEnded) as got:
        steps_ingest(steps=[step_in("e1", 0, prompt=PROMPT, response=[1], is_last=True)])
        steps_ingest(steps=[step_in("e2", 0, prompt=PROMPT, response=[1])])
        trajectory_complete(uid="e2", reward=1.0)
    # then: one event each, with what its effects need
    assert [
        [(t.uid, t.status, t.step_count, t.reward_pending, t.just_ended) for t in e.trajectories] for e in got
    ] == [
        [("e1", "completed", 1, True, True)],
        [("e2", "completed", 1, False, True)],
    ]
