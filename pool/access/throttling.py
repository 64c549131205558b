"""Per-API-key rate limits for the REST API: a token bucket per key, refilled at
CLAW_RATE_LIMIT_PER_SECOND up to CLAW_RATE_LIMIT_BURST requests (0 turns limits off).

With REDIS_URL the bucket lives in Redis (one atomic script call per request, so every app
process shares it); without, in this process (a dict: O(1), no lock needed for a limit that
tolerates a lost race). Over the limit: 429 with Retry-After, in the API's error shape.

Operator sessions are not limited (people, not programs). The OpenAI-compatible gateway
paths are not limited here: they skip Django's middleware and DRF for speed (a Redis round
trip would add to every proxied call), and an agent's calls are paced by the upstream's
generation time (seconds each).
"""

from __future__ import annotations

import math
import time

from django.conf import settings
from rest_framework.throttling import BaseThrottle

from claw_kit.redis_conn import redis_client

from .auth import KeyPrincipal

# KEYS[1] = bucket; ARGV = rate/s, burst, now (s). Stores tokens and the time of the last
# refill; returns 0 when a token was taken, else the seconds until one is available (text).
_LUA = """
local rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local state = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 't', tokens, 'at', now)
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 1)
return tostring(wait)
"""
_buckets: dict[str, tuple[float, float]] = {}  # key prefix -> (tokens, monotonic time)
_MAX_BUCKETS = 100_000


def rate_limit_take(key: str, *, rate: float, burst: int) -> float:
    """Take one token from ``key``'s bucket: 0.0 when allowed, else the seconds to wait.
    Redis errors fail open (allowed): a broker hiccup must not refuse all traffic."""
    client = redis_client()
    if client is not None:
        try:
            script = _script(client)
            return float(script(keys=[f"claw:rl:{key}"], args=[rate, burst, time.time()]))
        except Exception:  # noqa: BLE001 - fail open, see the docstring
            return 0.0
    now = time.monotonic()
    tokens, at = _buckets.get(key, (float(burst), now))
    tokens = min(float(burst), tokens + (now - at) * rate)
    if tokens >= 1:
        wait, tokens = 0.0, tokens - 1
    else:
        wait = (1 - tokens) / rate
    if len(_buckets) >= _MAX_BUCKETS:
        _buckets.clear()
    _buckets[key] = (tokens, now)
    return wait


_scripts: dict[int, object] = {}


def _script(client):
    script = _scripts.get(id(client))
    if script is None:
        script = _scripts[id(client)] = client.register_script(_LUA)
    return script


class ApiKeyRateThrottle(BaseThrottle):
    """DRF throttle (settings REST_FRAMEWORK DEFAULT_THROTTLE_CLASSES)."""

    def allow_request(self, request, view) -> bool:
        rate = settings.CLAW_RATE_LIMIT_PER_SECOND
        user = getattr(request, "user", None)
        if rate <= 0 or not isinstance(user, KeyPrincipal):
            return True
        self._wait = rate_limit_take(
            f"key:{user.key.key_id}", rate=rate, burst=max(1, settings.CLAW_RATE_LIMIT_BURST)
        )
        return self._wait <= 0

    def wait(self) -> float:
        return max(1, math.ceil(self._wait))
