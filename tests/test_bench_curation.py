"""bench.curation's figure functions on a pool of 256 steps (the bench itself builds 200k
on PostgreSQL): the preview admits exactly what the W-pool generator says, the admin step
list answers, and every step of the readiness run ends ready."""

from __future__ import annotations

import pytest

from bench import curation
from pool.models import Step
from pool.services.policy import policy_version_set


@pytest.mark.django_db
def test_curation_figures_on_a_small_pool():
    # given: 8 W-pool groups (256 steps), policy versions 1..5 with 5 current
    for v in range(1, curation.VERSIONS + 1):
        policy_version_set(version=v)
    gen = curation.WPool()
    groups = curation.pool_grow(gen, 8)
    result: dict = {}

    # when
    curation.measure_size("small", groups, 1, result)
    curation.measure_admin("small", 1, result)
    curation.measure_readiness(gen, 256, result, batch=64)

    # then
    assert result["steps_small"] == 256
    assert result["preview_matches_small"], (result["preview_small"], result["preview_expected_steps_small"])
    assert result["preview_expected_steps_small"] > 0
    assert result["readiness_ready"] == result["readiness_steps"] == 256
    assert Step.objects.count() == 512
