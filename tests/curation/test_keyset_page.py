"""Keyset paging of the browse pages (curation.selectors.pages.keyset_page): every row once,
newest first, across pages, and no next page after the last."""

from __future__ import annotations

import pytest

from curation.selectors.optimization import optimization_overview
from curation.selectors.pages import steps_browse, trajectories_browse
from pool.ingest.pipeline import steps_ingest
from pool.services.groups import group_upsert
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def pages(browse) -> list[list[int]]:
    out, before = [], None
    while True:
        rows, before = browse(before)
        out.append([r.id for r in rows])
        if before is None:
            return out


def test_steps_trajectories_and_groups_page_by_id_without_gaps_or_repeats():
    for i in range(7):
        group_upsert(uid=f"g{i}", expected_rollouts=1)
        steps_ingest(steps=[step_in(f"t{i}", 0, prompt=[1, i], response=[2], group=f"g{i}")])

    steps = pages(lambda b: steps_browse(before=b, limit=3))
    trajs = pages(lambda b: trajectories_browse(before=b, limit=3))

    def groups(b):
        o = optimization_overview(before=b, limit=3)
        return [r["group"] for r in o["rows"]], o["next_before"]

    for got in (steps, trajs, pages(groups)):
        assert [len(p) for p in got] == [3, 3, 1]
        flat = [i for p in got for i in p]
        assert flat == sorted(flat, reverse=True) and len(set(flat)) == 7
