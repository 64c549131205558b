"""One gateway process keeps hundreds of upstream calls in flight (no thread per call), and
step indexes stay distinct under concurrency. The server runs the project's ASGI app with the
gateway paths on the lean handler (gateway/proxy/asgi.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.gateway.proxy_support import auth, steps_of
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"
IN_FLIGHT = 256
# The slow upstream's 300 ms plus 7.7 s asked per call. Long enough that the client's own
# cost (the openai SDK needs ~1.5 s of CPU here for 256 concurrent calls, even straight to
# the upstream; twice that on a busy machine) and the recording stay well inside one call.
CALL_SECONDS = 8.0


@dataclass
class Gateway:
    server: LiveServer
    key: str

    def aclient(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=60, **kw
        )


@pytest.fixture(scope="module")
def gw(tmp_path_factory, slow_upstream) -> Iterator[Gateway]:
    env = {"CLAW_UPSTREAM_URL": slow_upstream, "CLAW_API_KEY_CACHE_SECONDS": "10"}  # production's key cache
    with live_server(tmp_path_factory.mktemp("conc"), env) as server:
        yield Gateway(server, server.make_key("ingest", "read"))


def _stats(gw: Gateway) -> dict:
    return httpx.get(f"{gw.server.url}/api/v1/stats", headers=auth(gw.key), timeout=30).json()


async def test_256_upstream_calls_are_in_flight_at_once(gw):
    # given: 256 agents, each call taking 3 s upstream
    client = gw.aclient(default_headers={"x-demo-delay-ms": str(int(CALL_SECONDS * 1000 - 300))})
    before = _stats(gw)["steps"]

    # when: they all call at once
    t0 = time.perf_counter()
    results = await asyncio.gather(
        *(
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"agent {i}"}])
            for i in range(IN_FLIGHT)
        )
    )
    elapsed = time.perf_counter() - t0
    await client.close()

    # then: all answered, and in one wave: had fewer than 256 calls been in flight together,
    # a second wave of 8 s calls would have pushed the total past 16 s
    assert len(results) == IN_FLIGHT and all(r.choices[0].message.content for r in results)
    assert elapsed < 2 * CALL_SECONDS - 0.1, f"{IN_FLIGHT} calls of {CALL_SECONDS} s took {elapsed:.2f} s"
    # and: every call was recorded
    assert _stats(gw)["steps"] - before == IN_FLIGHT


async def test_concurrent_calls_of_one_trajectory_get_consecutive_indexes(gw):
    # given: 64 calls of one trajectory at once
    client = gw.aclient(default_headers={"X-Claw-Trajectory": "one-traj-64"})

    # when
    await asyncio.gather(
        *(
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"call {i}"}])
            for i in range(64)
        )
    )
    await client.close()

    # then
    steps = []
    url = f"{gw.server.url}/api/v1/steps?trajectory_uid=one-traj-64"
    while url:
        page = httpx.get(url, headers=auth(gw.key), timeout=30).json()
        steps += page["results"]
        url = page["next"]
    assert sorted(s["step_index"] for s in steps) == list(range(64))


@pytest.mark.parametrize("stream", [False, True])
def test_an_agent_that_hangs_up_before_the_answer_leaves_no_step_and_the_server_serves_on(gw, stream):
    # given: a call whose upstream answer takes 1.8 s, abandoned by its agent after 0.3 s
    traj = f"hung-up-{stream}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "bye"}], "stream": stream}
    headers = {**auth(gw.key), "X-Claw-Trajectory": traj, "x-demo-delay-ms": "1500"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gw.server.url}/v1/chat/completions",
            json=body,
            headers=headers,
            timeout=httpx.Timeout(5, read=0.3),
        )

    # when: the next call comes, after the abandoned one would have been answered
    time.sleep(2)
    r = httpx.post(
        f"{gw.server.url}/v1/chat/completions",
        json={**body, "stream": False},
        headers={**auth(gw.key), "X-Claw-Trajectory": f"after-{traj}"},
        timeout=30,
    )

    # then: the gateway cancelled the abandoned call (no step) and serves the next one
    assert r.status_code == 200
    assert len(steps_of(gw.server, gw.key, f"after-{traj}")) == 1
    assert steps_of(gw.server, gw.key, traj) == []
