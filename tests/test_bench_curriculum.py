"""bench.curriculum's W-tasks runs on a small scale, through the real API (the bench itself
runs 20,000 groups per strategy on PostgreSQL): the pool's task statistics agree with the
bench's own count of groups with signal, and the pull figures (oldest first, by priority)
answer."""

from __future__ import annotations

import pytest
from django.db.models import Sum
from django.test import Client

from bench import curriculum
from pool.models import Scope, Task
from pool.services.api_keys import api_key_create


@pytest.mark.django_db
@pytest.mark.parametrize("strategy", ["uniform", "informative"])
def test_a_small_curriculum_run_is_counted_by_the_task_statistics(strategy):
    # given an ingest key's client
    client = Client(HTTP_AUTHORIZATION=f"Bearer {api_key_create(name='b', scopes=[Scope.INGEST])[1]}")
    # when two rounds of 64 groups run
    signal = curriculum.curriculum(client, strategy, 128, 0)
    # then every group was counted once into its task, and the informative groups the pool
    # counted are the bench's groups with signal
    tasks = Task.objects.filter(set_name=f"wt-{strategy}")
    assert tasks.count() == curriculum.N_TASKS
    agg = tasks.aggregate(seen=Sum("seen"), rewarded=Sum("rewarded"), informative=Sum("informative_groups"))
    assert agg["seen"] == 128 and agg["rewarded"] == 128 * curriculum.GROUP
    assert agg["informative"] == round(signal * 128)
    # and the pulls, oldest ready first and by priority, serve those groups
    pulls = curriculum.pull_latency(2)
    assert set(pulls) == {"oldest", "priority"} and min(pulls.values()) > 0
