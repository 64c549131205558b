"""POST /api/v1/trajectories hands out a capability base URL (the OpenAI door's equivalent of
Claw-R1's init_trajectory); its use by an agent is in test_capability_urls.py."""

from __future__ import annotations

import pytest

from pool.models import TrajectoryCapability
from pool.services.capabilities import trajectory_capability_verify
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def test_post_trajectories_returns_a_capability_base_url(agent):
    resp = agent.post("/api/v1/trajectories", {"uid": "api-t", "prompt_group_uid": "api-g"}, format="json")
    assert resp.status_code == 201
    base_url = resp.json()["base_url"]
    prefix, token = "http://testserver/t/c/", base_url.split("/")[5]
    assert base_url == f"{prefix}{token}/api-t/api-g/v1"
    assert trajectory_capability_verify(token=token, trajectory_uid="api-t").source_id is not None
    # and: without a group the URL says "-"; reading back never shows a token
    bare = agent.post("/api/v1/trajectories", {"uid": "api-u"}, format="json").json()
    assert bare["base_url"].endswith("/api-u/-/v1")
    assert "base_url" not in agent.get("/api/v1/trajectories/api-t").json()


def test_post_trajectories_gives_no_url_without_a_key_or_a_path_safe_uid(agent, operator):
    assert agent.post("/api/v1/trajectories", {"uid": "a/b"}, format="json").json()["base_url"] is None
    session = client_for(None)
    session.force_login(operator)
    resp = session.post("/api/v1/trajectories", {"uid": "by-operator"}, format="json")
    assert resp.status_code == 201 and resp.json()["base_url"] is None
    assert TrajectoryCapability.objects.count() == 0
