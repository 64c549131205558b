"""Revocation across processes: a revoked key stops working in every server process within
CLAW_API_KEY_CACHE_SECONDS (the bound the README promises), not only in the process that
revoked it. Two real server processes share one database; the key is revoked by a third
(the management command), so neither server's own cache clear helps: only the bound does."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.live import LiveServer

pytestmark = pytest.mark.live

CACHE_S = 1.0  # the default (claw_site/settings/base.py)


def _status(server: LiveServer, key: str) -> int:
    return httpx.get(
        f"{server.url}/api/v1/steps",
        params={"page_size": 1},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    ).status_code


def test_a_revoked_key_is_refused_by_every_process_within_the_cache_bound(tmp_path):
    env = {"CLAW_API_KEY_CACHE_SECONDS": str(CACHE_S)}
    first = LiveServer(tmp_path, env)
    second = None
    try:
        first.start()
        # the second process: same database (the SQLite file under the same CLAW_VAR_DIR, or
        # the first's PostgreSQL database), its own port and its own key cache
        second = LiveServer(
            tmp_path,
            {**env, **({"DATABASE_URL": first.env["DATABASE_URL"]} if "DATABASE_URL" in first.env else {})},
        )
        second.start(migrate=False)
        key = first.make_key("read")
        other = first.make_key("read")
        # given: both processes have verified (and cached) the key
        assert [_status(first, key), _status(second, key)] == [200, 200]

        first.manage("revoke_api_key", key.split("_")[1])
        revoked_at = time.monotonic()

        # then: each process refuses it once its cached verdict expires, and never accepts it again
        refused_after = {}
        deadline = revoked_at + CACHE_S + 30  # the bound plus room for a loaded machine
        while len(refused_after) < 2 and time.monotonic() < deadline:
            for name, server in (("first", first), ("second", second)):
                if name not in refused_after and _status(server, key) == 401:
                    refused_after[name] = time.monotonic() - revoked_at
        assert set(refused_after) == {"first", "second"}
        assert [_status(first, key), _status(second, key)] == [401, 401]
        # and: another key of the same processes is untouched
        assert [_status(first, other), _status(second, other)] == [200, 200]
    finally:
        if second is not None:
            second.close()
        first.close()
