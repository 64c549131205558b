"""Tests: the same code as production, on SQLite by default or on DATABASE_URL/REDIS_URL.

Celery is NOT globally eager here: tests assert enqueues with
django_capture_on_commit_callbacks and run tasks explicitly, so on-commit handling and
argument serialisation are exercised for real.
"""

import os
from pathlib import Path
from urllib.parse import urlparse, urlunparse

# Parallel runs (pytest-xdist, `make test`): each worker process gets its own var dir (media,
# snapshot files) and its own Redis database (broker, channel layer, rate limits), set in the
# environment before the base settings read it, so the live servers and Celery workers a test
# starts inherit them too. Databases are per worker already: pytest-django suffixes the test
# database with the worker id, and tests/live.py gives each live server its own.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; unset without xdist
if _WORKER:
    _n = int(_WORKER.removeprefix("gw"))
    os.environ["CLAW_VAR_DIR"] = str(Path(__file__).resolve().parents[2] / "var" / f"test-{_WORKER}")
    # Once per worker: a subprocess that inherits the worker's environment and imports these
    # settings again (a bench run by a test: DJANGO_SETTINGS_MODULE and PYTEST_XDIST_WORKER
    # inherited) must keep the worker's database, not shift again onto the next worker's.
    if os.environ.get("REDIS_URL") and os.environ.get("CLAW_TEST_REDIS_WORKER") != _WORKER:
        # Database base+1+N: two suites on one Redis (REDIS_URL .../0 and .../8) stay apart.
        _redis = urlparse(os.environ["REDIS_URL"])
        _base = int(_redis.path.strip("/") or 0)
        os.environ["REDIS_URL"] = urlunparse(_redis._replace(path=f"/{(_base + 1 + _n) % 16}"))
        os.environ["CLAW_TEST_REDIS_WORKER"] = _WORKER

from .base import *  # noqa: E402, F403
from .base import REDIS_URL, env_bool, env_float  # noqa: E402

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; never in production
CLAW_API_KEY_CACHE_SECONDS = 0.0
CLAW_COMPILED_CHECK = env_bool("CLAW_COMPILED_CHECK", True)  # pool/compiled.py
CELERY_TASK_ALWAYS_EAGER = False
if not REDIS_URL:
    CELERY_BROKER_URL = "memory://localhost/"  # no "No hostname was supplied" (base.py)
# Rate limits off unless asked for: a test's requests come faster than any client's; the
# limiter's own tests turn it on (tests/gateway/test_throttling.py).
CLAW_RATE_LIMIT_PER_SECOND = env_float("CLAW_RATE_LIMIT_PER_SECOND", 0.0)
