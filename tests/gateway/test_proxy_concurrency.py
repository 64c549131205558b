"""One gateway process keeps hundreds of upstream calls in flight (no thread per call), and
step indexes stay distinct under concurrency. The server runs the project's ASGI app with the
gateway paths on the lean handler (gateway/proxy/asgi.py).

No test here reads the clock: the upstream's hooks (tests/gateway/upstream_harness.py) hold
calls until a condition holds (N calls in flight at once, or the caller gone), and the tests
wait on those conditions, each with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.gateway.proxy_support import auth, steps_of
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"
IN_FLIGHT = 256
DEADLINE_S = 30


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    def aclient(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=60, **kw
        )


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    env = {"CLAW_UPSTREAM_URL": demo_upstream, "CLAW_API_KEY_CACHE_SECONDS": "10"}  # production's key cache
    with live_server(tmp_path_factory.mktemp("conc"), env) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


def _stats(gw: Gateway) -> dict:
    return httpx.get(f"{gw.server.url}/api/v1/stats", headers=auth(gw.key), timeout=30).json()


async def test_256_upstream_calls_are_in_flight_at_once(gw):
    # given: 256 agents, whose calls the upstream answers only once all 256 reached it
    barrier = {"x-test-barrier": f"in-flight:{IN_FLIGHT}"}
    client = gw.aclient(default_headers=barrier)
    before = _stats(gw)["steps"]

    # when: they all call at once
    results = await asyncio.gather(
        *(
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"agent {i}"}])
            for i in range(IN_FLIGHT)
        )
    )
    await client.close()

    # then: all answered, so all 256 were in flight through the gateway together (had fewer
    # been, the barrier would have answered 503 after its deadline, failing the gather)
    assert len(results) == IN_FLIGHT and all(r.choices[0].message.content for r in results)
    # and: every call was recorded
    assert _stats(gw)["steps"] - before == IN_FLIGHT


async def test_concurrent_calls_of_one_trajectory_get_consecutive_indexes(gw):
    # given: 64 calls of one trajectory at once, answered together (all recorded concurrently)
    client = gw.aclient(default_headers={"X-Claw-Trajectory": "one-traj-64", "x-test-barrier": "one-traj:64"})

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
    # given: a call the upstream does not answer while its caller is connected, abandoned by
    # its agent after 0.3 s
    traj = f"hung-up-{stream}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "bye"}], "stream": stream}
    headers = {**auth(gw.key), "X-Claw-Trajectory": traj, "x-test-hold": traj}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{gw.server.url}/v1/chat/completions",
            json=body,
            headers=headers,
            timeout=httpx.Timeout(5, read=0.3),
        )

    # when: the gateway hangs up on the upstream in turn (it cancelled the call), and the next
    # call comes
    _wait_until(lambda: traj in _disconnected(gw), f"the gateway to drop the upstream call of {traj}")
    r = httpx.post(
        f"{gw.server.url}/v1/chat/completions",
        json={**body, "stream": False},
        headers={**auth(gw.key), "X-Claw-Trajectory": f"after-{traj}"},
        timeout=30,
    )

    # then: the abandoned call left no step (it can get no answer now), and the next one is served
    assert r.status_code == 200
    assert len(steps_of(gw.server, gw.key, f"after-{traj}")) == 1
    assert steps_of(gw.server, gw.key, traj) == []


def _disconnected(gw: Gateway) -> list[str]:
    """The x-test-hold calls whose caller (the gateway) hung up on the upstream."""
    return httpx.get(f"{gw.upstream.removesuffix('/v1')}/test/disconnected", timeout=10).json()


def _wait_until(cond: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S} s waiting for {what}")
        time.sleep(0.05)
