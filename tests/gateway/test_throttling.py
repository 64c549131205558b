"""Per-API-key rate limits on the REST API: a token bucket per key (Redis when configured,
else in-process), 429 with Retry-After in the API's error shape, keys independent."""

from __future__ import annotations

import pytest

from claw_kit.redis_conn import redis_client
from pool.access import throttling
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def limited(settings):
    """A tiny bucket (3 requests, then 1 every 100 s): refills never happen within a test,
    so the outcome does not depend on timing."""
    settings.CLAW_RATE_LIMIT_PER_SECOND = 0.01
    settings.CLAW_RATE_LIMIT_BURST = 3
    throttling._buckets.clear()
    client = redis_client()
    if client is not None:
        for key in client.scan_iter("claw:rl:*"):
            client.delete(key)
    yield
    throttling._buckets.clear()


def test_a_key_over_its_burst_gets_429_with_retry_after(limited, reader_key):
    # given a key with a burst of 3
    reader = client_for(reader_key)
    # when it makes 4 requests in a row
    statuses = [reader.get("/api/v1/stats").status_code for _ in range(4)]
    # then the 4th is refused, saying when to come back, in the API's error shape
    assert statuses == [200, 200, 200, 429]
    resp = reader.get("/api/v1/stats")
    assert resp.status_code == 429
    assert int(resp["Retry-After"]) >= 1
    assert resp.json()["error"]["type"] == "rate_limit_error"


def test_keys_have_their_own_buckets(limited, reader_key, make_key):
    first, second = client_for(reader_key), client_for(make_key("read", name="other"))
    for _ in range(3):
        assert first.get("/api/v1/stats").status_code == 200
    assert first.get("/api/v1/stats").status_code == 429
    # another key is not affected
    assert second.get("/api/v1/stats").status_code == 200


def test_a_refused_write_writes_nothing(limited, agent_key):
    from pool.models import Trajectory

    agent = client_for(agent_key)
    for i in range(3):
        assert agent.post("/api/v1/trajectories", {"uid": f"rl-{i}"}, format="json").status_code in (200, 201)
    resp = agent.post("/api/v1/trajectories", {"uid": "rl-over"}, format="json")
    assert resp.status_code == 429
    assert not Trajectory.objects.filter(uid="rl-over").exists()


def test_operators_and_disabled_limits_are_not_limited(limited, settings, operator, reader_key):
    from django.test import Client

    session = Client()
    session.force_login(operator)
    assert all(session.get("/api/v1/stats").status_code == 200 for _ in range(5))
    settings.CLAW_RATE_LIMIT_PER_SECOND = 0
    reader = client_for(reader_key)
    assert all(reader.get("/api/v1/stats").status_code == 200 for _ in range(5))


def test_the_bucket_refills_over_time(monkeypatch, settings):
    # the in-process bucket with a controlled clock (no Redis, no sleeping)
    monkeypatch.setattr(throttling, "redis_client", lambda: None)
    now = [1000.0]
    monkeypatch.setattr(throttling.time, "monotonic", lambda: now[0])
    throttling._buckets.clear()
    take = lambda: throttling.rate_limit_take("k", rate=2.0, burst=2)  # noqa: E731
    assert [take(), take()] == [0.0, 0.0]
    assert take() == pytest.approx(0.5)  # empty: one token in half a second
    now[0] += 0.5
    assert take() == 0.0
    assert take() > 0


def test_redis_failure_fails_open(settings, monkeypatch):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert throttling.rate_limit_take("k", rate=1.0, burst=1) == 0.0
