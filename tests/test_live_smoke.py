"""The real server process serves the API over HTTP with a minted key."""

import httpx
import pytest

pytestmark = pytest.mark.live


def test_live_server_ingests_and_reads(live):
    key = live.make_key("ingest", "read")
    h = {"Authorization": f"Bearer {key}"}
    step = {"trajectory_uid": "t", "step_index": 0, "prompt_ids": [1, 2, 3], "response_ids": [4]}
    r = httpx.post(f"{live.url}/api/v1/steps", json={"steps": [step]}, headers=h)
    assert r.status_code == 201, r.text
    assert httpx.get(f"{live.url}/api/v1/steps/t:0", headers=h).json()["response_ids"] == [4]
