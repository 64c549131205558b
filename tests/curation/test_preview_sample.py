"""The live preview of an unsaved spec on a large pool: estimated from a sample of units
(curation/selectors/specs.py, ``_sampled_preview``), at a cost that does not grow with the
pool, and counted exactly where the pool is small or the sample admits too little to tell.

One pool, one table of specs; each estimate is compared, figure by figure, with the exact
count of the same spec: each figure within four times its own 95% margin. The draw depends on
where earlier tests left rows in the tables, so the bound is one no draw crosses by chance
(about 8 standard deviations), and each kind of unit is drawn some 50 times or more: a
smaller stratum's variance, estimated from a handful of draws, could itself be far off."""

from __future__ import annotations

import random
import uuid

import pytest
from django.db import connection

from curation.selectors.specs import dataset_preview
from curation.specs import spec_parse
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Source, Trajectory
from pool.services.readiness import readiness_sweep
from tests.conftest import client_for
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

GROUPS, ROLLOUTS, LONE, TINY = 1000, 2, 1000, 5

# (name, spec, CLAW_PREVIEW_SAMPLE_UNITS, estimated): "tiny" is the name of a source of TINY groups.
CASES = [
    ("everything", {}, 150, True),
    ("rewarded", {"filters": {"reward_min": 0.3}}, 150, True),
    ("step units", {"grouping": {"keep_groups_whole": False}}, 150, True),
    ("a sliver: too few units in the sample", {"filters": {"sources": ["tiny"]}}, 150, False),
    ("a small pool: no more than twice the sample", {}, 2000, False),
    ("a sample reading most of the pool", {}, 400, False),  # 40% of the groups: exact is cheaper
]


def _pool(big: Source, tiny: Source) -> None:
    """GROUPS groups of ROLLOUTS one-step rollouts and LONE trajectories without a group, of
    ``big``, and TINY groups of ``tiny``; rewards uniform in [0, 1); all ready."""
    rng = random.Random(3)
    for source, n, lone in ((big, GROUPS, LONE), (tiny, TINY, 0)):
        batch = []
        for g in range(n):
            uid = f"ps-{source.name}-g{g}"
            for r in range(ROLLOUTS):
                batch.append(
                    step_in(
                        f"{uid}-r{r}",
                        0,
                        prompt=[1, 2, 3, g % 50, r],
                        response=[4] * rng.randint(1, 9),
                        group=uid,
                        reward=round(rng.random(), 3),
                        is_last=True,
                    )
                )
        for t in range(lone):
            batch.append(
                step_in(
                    f"ps-{source.name}-t{t}",
                    0,
                    prompt=[5, 6, t % 50],
                    response=[7] * rng.randint(1, 9),
                    reward=round(rng.random(), 3),
                    is_last=True,
                )
            )
        steps_ingest(steps=batch, source_id=source.id, sources=None)
    PromptGroup.objects.filter(uid__startswith="ps-").update(expected_rollouts=ROLLOUTS)
    readiness_sweep()


def test_a_large_pool_previews_an_unsaved_spec_from_a_sample_within_its_margin(settings, admin_key):
    if connection.vendor != "postgresql":
        pytest.skip("sampled previews need PostgreSQL's TABLESAMPLE (SQLite counts exactly)")
    big = Source.objects.create(name=f"ps-big-{uuid.uuid4().hex[:6]}")
    tiny = Source.objects.create(name=f"ps-tiny-{uuid.uuid4().hex[:6]}")
    _pool(big, tiny)
    with connection.cursor() as cur:  # the row counts the fractions are drawn from, as autovacuum keeps them
        cur.execute(f"ANALYZE {PromptGroup._meta.db_table}, {Trajectory._meta.db_table}")
    for name, raw, want, estimated in CASES:
        settings.CLAW_PREVIEW_SAMPLE_UNITS = want
        raw = {k: {f: ([tiny.name] if v == ["tiny"] else v) for f, v in d.items()} for k, d in raw.items()}
        spec = spec_parse(raw)
        exact = dataset_preview(spec)
        got = dataset_preview(spec, estimate=True)
        assert exact["estimate"] is None, name
        assert exact["steps"] > 0, name
        if not estimated:
            assert got == exact, name
            continue
        est = got["estimate"]
        assert est is not None, name
        # a real sample: fewer units than the pool holds, each kind drawn at its fraction
        assert 0 < est["units_sampled"] < GROUPS + LONE, name
        assert 0 < est["group_fraction"] < 1 and 0 < est["trajectory_fraction"] < 1, name
        # each figure within its own 95% margin, four times over
        for key, margin in est["margins"].items():
            assert margin >= 0, (name, key, est)  # 0: every drawn unit alike (every group admitted)
            assert abs(got[key] - exact[key]) <= 4 * margin, (name, key, got[key], exact[key], margin)
        assert 0 < est["margins"]["steps"] < exact["steps"], name
        figures = ("steps", "masked_steps", "trajectories", "dropped_groups", "waiting_units")
        figures += ("prompt_tokens", "response_tokens")
        assert set(est["margins"]) == set(figures) | ({"groups"} if exact["groups"] is not None else set())
        assert got["groups"] is None if exact["groups"] is None else got["groups"] > 0, name
        assert got["current_policy_version"] == exact["current_policy_version"], name

    # and a reader restricted to some sources counts exactly, its sources' steps alone (a
    # sample's fractions would tell it the whole pool's size)
    settings.CLAW_PREVIEW_SAMPLE_UNITS = 150
    spec = spec_parse({})
    assert dataset_preview(spec, estimate=True)["estimate"] is not None
    restricted = dataset_preview(spec, frozenset({big.id}), estimate=True)
    assert restricted == dataset_preview(spec, frozenset({big.id}))
    assert restricted["estimate"] is None and restricted["steps"] == GROUPS * ROLLOUTS + LONE

    # and the API estimates the same, or counts exactly when asked
    client = client_for(admin_key)
    sampled = client.post("/api/v1/datasets/preview", {"filters": {"reward_min": 0.3}}, format="json")
    exactly = client.post(
        "/api/v1/datasets/preview", {"filters": {"reward_min": 0.3}, "exact": True}, format="json"
    )
    assert sampled.status_code == exactly.status_code == 200, (sampled.content, exactly.content)
    spec = spec_parse({"filters": {"reward_min": 0.3}})
    assert sampled.json() == dataset_preview(spec, estimate=True)
    assert exactly.json() == dataset_preview(spec)
