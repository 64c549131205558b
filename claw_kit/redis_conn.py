"""One Redis client per process for the app's own uses (readiness, queue depth, rate limits),
or None in embedded mode (no REDIS_URL). Celery and Channels keep their own connections."""

from __future__ import annotations

import functools

import redis
from django.conf import settings

# Short timeouts: a readiness probe or a rate-limit check must fail fast, not hang a request.
SOCKET_TIMEOUT_S = 2.0


def redis_client() -> redis.Redis | None:
    url = settings.REDIS_URL
    return _client(url) if url else None


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S)
