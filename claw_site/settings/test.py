"""Tests: the same code as production, on SQLite by default or on DATABASE_URL/REDIS_URL.

Celery is NOT globally eager here: tests assert enqueues with
django_capture_on_commit_callbacks and run tasks explicitly, so on-commit handling and
argument serialisation are exercised for real.
"""

from .base import *  # noqa: F403
from .base import REDIS_URL, env_float

DEBUG = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed; never in production
CLAW_API_KEY_CACHE_SECONDS = 0.0
CELERY_TASK_ALWAYS_EAGER = False
if not REDIS_URL:
    CELERY_BROKER_URL = "memory://localhost/"  # no "No hostname was supplied" (base.py)
# Rate limits off unless asked for: a test's requests come faster than any client's; the
# limiter's own tests turn it on (tests/gateway/test_throttling.py).
CLAW_RATE_LIMIT_PER_SECOND = env_float("CLAW_RATE_LIMIT_PER_SECOND", 0.0)
