"""The real server process serves the API over HTTP with a minted key; the processes of one
run share one migrated template for their servers."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.live import ROOT, SHARED_ENV, drop_shared

pytestmark = pytest.mark.live


def test_live_server_ingests_and_reads(live):
    key = live.make_key("ingest", "read")
    h = {"Authorization": f"Bearer {key}"}
    step = {"trajectory_uid": "t", "step_index": 0, "prompt_ids": [1, 2, 3], "response_ids": [4]}
    r = httpx.post(f"{live.url}/api/v1/steps", json={"steps": [step]}, headers=h)
    assert r.status_code == 201, r.text
    assert httpx.get(f"{live.url}/api/v1/steps/t:0", headers=h).json()["response_ids"] == [4]


SHARE = """
import json, os
from tests.live import _template
t = _template()
print(json.dumps({"pid": os.getpid(), "pg_name": t.pg_name, "sqlite": str(t.sqlite_path)}))
"""


def test_processes_of_one_run_share_one_template_migrated_once(tmp_path):
    """Three processes asking at once for the run's template (tests/live.py): one migrates it,
    the others wait on the lock and copy from the same database. A second maker would fail
    writing the record the first wrote (exit status), or name another database."""
    # given a run's shared folder, empty
    env = {**os.environ, SHARED_ENV: str(tmp_path)}
    try:
        # when three processes start together and each asks for a template
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", SHARE], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
            )
            for _ in range(3)
        ]
        got = [json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1]) for p in procs]
        assert all(p.returncode == 0 for p in procs)
        # then they name one template, which exactly one of them made
        assert len({(g["pg_name"], g["sqlite"]) for g in got}) == 1, got
        made = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
        assert len(made) == 1 and made[0]["pid"] in {g["pid"] for g in got}, (made, got)
        assert made[0]["pg_name"] == got[0]["pg_name"]
        assert (got[0]["pg_name"] is None) == (not os.environ.get("DATABASE_URL"))
    finally:
        drop_shared(tmp_path)
    # and the run's end drops it
    assert not tmp_path.exists()
