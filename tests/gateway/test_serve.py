"""`manage.py serve` in embedded mode runs celery beat's schedule itself
(claw_site/management/commands/serve.py ``beat_schedule``, ``sweep_forever``): exactly the
entries of settings.CELERY_BEAT_SCHEDULE, each task by name at its interval; and it reads
its environment through the settings."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from celery.schedules import crontab
from django.conf import settings
from django.core.management.base import CommandError
from django.test import override_settings

from claw_site.celery import app as celery_app
from claw_site.management.commands import serve

DEADLINE_S = 30.0


def test_serve_runs_exactly_the_beat_schedule():
    # when serve reads the schedule it runs without celery beat
    schedule = serve.beat_schedule()
    # then it is every entry of CELERY_BEAT_SCHEDULE, in order, each task at its interval
    beat = settings.CELERY_BEAT_SCHEDULE
    assert [(p.name, p.task, p.every_s) for p in schedule] == [
        (name, e["task"], float(e["schedule"])) for name, e in beat.items()
    ]
    # and the tasks serve runs are the beat schedule's, the outbox relay included
    assert {p.task for p in schedule} == {e["task"] for e in beat.values()}
    assert "pool.outbox_relay" in {p.task for p in schedule}
    assert all(p.task in celery_app.tasks for p in schedule)


@override_settings(
    CELERY_BEAT_SCHEDULE={
        "a": {"task": "pool.readiness_sweep", "schedule": timedelta(seconds=5)},
        "b": {"task": "curation.leases_expire", "schedule": 2},
    }
)
def test_an_entry_is_seconds_or_a_timedelta():
    assert [(p.name, p.every_s) for p in serve.beat_schedule()] == [("a", 5.0), ("b", 2.0)]


@pytest.mark.parametrize(
    "entry,words",
    [
        ({"task": "pool.no_such_task", "schedule": 60}, "no task named 'pool.no_such_task'"),
        ({"task": "pool.readiness_sweep", "schedule": crontab(minute="*/5")}, "intervals only"),
        ({"task": "pool.readiness_sweep", "schedule": 0}, "intervals only"),
    ],
)
def test_an_entry_serve_cannot_run_stops_it_at_start(entry, words):
    with override_settings(CELERY_BEAT_SCHEDULE={"bad": entry}), pytest.raises(CommandError, match=words):
        serve.beat_schedule()


def test_sweep_forever_runs_each_entry_at_its_interval(monkeypatch):
    # given two entries, one every 10 ms and one every 500 ms, and a third that fails
    from curation import tasks as curation_tasks
    from pool import tasks as pool_tasks

    runs: dict[str, int] = {"fast": 0, "slow": 0}
    slow_ran = threading.Event()

    def fast() -> dict[str, int]:
        runs["fast"] += 1
        return {"abandoned": 0}

    def slow() -> int:
        runs["slow"] += 1
        slow_ran.set()
        return 0

    def failing() -> None:
        raise RuntimeError("database restarting")

    monkeypatch.setattr(pool_tasks.readiness_sweep, "run", fast)
    monkeypatch.setattr(curation_tasks.leases_expire, "run", slow)
    monkeypatch.setattr(pool_tasks.outbox_relay, "run", failing)
    schedule = [
        serve.Periodic(name="fast", task="pool.readiness_sweep", every_s=0.01),
        serve.Periodic(name="failing", task="pool.outbox_relay", every_s=0.01),
        serve.Periodic(name="slow", task="curation.leases_expire", every_s=0.5),
    ]
    stop = threading.Event()
    thread = threading.Thread(target=serve.sweep_forever, args=(stop, schedule), daemon=True)
    # when the loop runs until the slow entry has run once
    thread.start()
    try:
        assert slow_ran.wait(DEADLINE_S), runs
        fast_by_then = runs["fast"]
    finally:
        stop.set()
        thread.join(DEADLINE_S)
    # then the fast one ran many times meanwhile, the failing one stopped neither, and the
    # loop stopped when told
    assert fast_by_then >= 2, runs
    assert not thread.is_alive()


@override_settings(CLAW_SERVE_HOST="0.0.0.0", CLAW_SERVE_PORT=8123, CLAW_SERVE_WORKERS=3)
def test_serve_options_default_to_the_settings():
    # HOST, PORT and CLAW_WORKERS are read by the settings' env helpers (settings/base.py)
    options = serve.Command().create_parser("manage.py", "serve").parse_args([])
    assert (options.host, options.port, options.workers) == ("0.0.0.0", 8123, 3)
