"""Each xdist worker's Redis database is chosen once (claw_site/settings/test.py): a process
that inherits a worker's environment and imports the test settings again (a bench a test
runs) stays on that worker's database instead of moving onto the next worker's, where its
servers' live events reached another test's dashboards."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.live import ROOT

pytestmark = pytest.mark.backend_independent  # settings read; no Redis is contacted

READ = "import os, django; django.setup(); print(os.environ['REDIS_URL'])"


def _settings_redis(env: dict[str, str]) -> tuple[str, str]:
    """REDIS_URL after a process with ``env`` imports the test settings, then after its child
    (which inherits what the first left in its environment) imports them again."""
    code = (
        READ
        + "; import subprocess, sys; print(subprocess.run([sys.executable, '-c', "
        + repr(READ)
        + "], capture_output=True, text=True, check=True).stdout.strip())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    first, second = out.stdout.split()
    return first, second


@pytest.mark.parametrize(("worker", "db"), [("gw0", "/1"), ("gw1", "/2"), ("gw3", "/4")])
def test_a_workers_children_keep_its_redis_database(worker, db):
    env = {k: v for k, v in os.environ.items() if k not in ("CLAW_TEST_REDIS_WORKER", "REDIS_URL")}
    env.update(
        PYTEST_XDIST_WORKER=worker,
        REDIS_URL="redis://127.0.0.1:6379/0",
        DJANGO_SETTINGS_MODULE="claw_site.settings.test",
    )
    assert _settings_redis(env) == (f"redis://127.0.0.1:6379{db}", f"redis://127.0.0.1:6379{db}")
