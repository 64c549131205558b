"""A spec filter that can match nothing (an empty list) previews and pulls as empty, not as a
server error (found by tests/test_schemathesis.py)."""

from __future__ import annotations

import pytest

from pool.ingest.pipeline import steps_ingest
from tests.conftest import client_for
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("filters", [{"sources": []}, {"sources": [], "readiness": "ready"}])
def test_an_empty_list_filter_previews_nothing(admin_key, filters):
    # given a ready step in the pool
    steps_ingest(steps=[step_in("pe-t", 0, prompt=[1], response=[2], reward=1.0, is_last=True)])
    # when a spec whose filter admits nothing is previewed
    resp = client_for(admin_key).post("/api/v1/datasets/preview", {"filters": filters}, format="json")
    # then it is an empty preview
    assert resp.status_code == 200, resp.content
    assert resp.json()["steps"] == 0


def test_an_offset_postgresql_refuses_is_read_in_utc(admin_key):
    # given a time with an offset beyond +-15:59 (valid ISO 8601, refused by PostgreSQL)
    when = "2457-02-12T19:15:46-17:18"
    client = client_for(admin_key)
    # when steps are listed and a spec previewed with it
    listed = client.get("/api/v1/steps", {"created_after": when})
    previewed = client.post("/api/v1/datasets/preview", {"filters": {"created_after": when}}, format="json")
    # then both answer (nothing is that recent)
    assert listed.status_code == 200, listed.content
    assert listed.json()["results"] == []
    assert previewed.status_code == 200, previewed.content
    assert previewed.json()["steps"] == 0
