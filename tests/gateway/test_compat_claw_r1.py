"""The Claw-R1 gateway protocol under /compat/claw-r1/, end to end against a live server and
the demo upstream: init -> register -> chat through the official openai client at the
returned base_url -> complete with a reward -> submit_steps; steps read back through the
REST API with the upstream's exact ids. Unlike Claw-R1, every endpoint needs an ingest key,
except under the capability URL init_trajectory returns, whose token alone authorises its
own trajectory (tests/gateway/test_capability_urls.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.gateway.proxy_support import auth, steps_of, trajectory_of, upstream_ids
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    def post(self, path: str, json: dict | None = None, **kw) -> httpx.Response:
        url = path if path.startswith("http") else f"{self.server.url}/compat/claw-r1/{path}"
        return httpx.post(url, json=json, headers=auth(self.key), timeout=30, **kw)


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    with live_server(tmp_path_factory.mktemp("claw-r1"), {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)


def test_a_claw_r1_black_box_agent_works_by_changing_only_the_gateway_url(gw):
    # given: a trajectory opened the Claw-R1 way (no body)
    init = httpx.post(f"{gw.server.url}/compat/claw-r1/init_trajectory", headers=auth(gw.key), timeout=30)
    assert init.status_code == 200
    traj, base_url = init.json()["trajectory_uid"], init.json()["base_url"]
    prompt_uid = base_url.rstrip("/").split("/")[-2]
    token = base_url.split("/")[-4]
    assert base_url == f"{gw.server.url}/compat/claw-r1/c/{token}/{traj}/{prompt_uid}/v1"
    assert trajectory_of(gw.server, gw.key, traj).json()["prompt_group_uid"] is None  # bound by use
    assert gw.post(
        f"{base_url}/register_trajectory",
        {"channel": "train", "metadata": {"policy_version": 3, "task": "demo"}},
    ).json() == {"status": "ok"}

    # when: the agent talks to base_url with the official client, two turns, then completes
    llm = openai.OpenAI(base_url=base_url, api_key=gw.key, max_retries=0)
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    bodies = []
    for turn in range(2):
        bodies.append({"model": MODEL, "messages": list(messages)})
        reply = llm.chat.completions.create(model=MODEL, messages=messages).choices[0].message.content
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And {turn}?"}]
    done = gw.post(f"{base_url}/complete_trajectory", {"reward": 1.0})

    # then: Claw-R1's answers, and the steps hold the upstream's exact ids
    assert done.status_code == 200 and done.json() == {"status": "ok"}
    steps = steps_of(gw.server, gw.key, traj)
    assert [s["step_index"] for s in steps] == [0, 1]
    for step, body in zip(steps, bodies, strict=True):
        expected = upstream_ids(gw.upstream, body)
        assert step["prompt_ids"] == expected["prompt_token_ids"]
        assert step["response_ids"] == expected["choices"][0]["token_ids"]
        assert step["token_source"] == "upstream" and step["policy_version"] == 3
        assert step["prompt_group_uid"] == prompt_uid and step["drift"] is False
    # and the trajectory metadata's task is the task its prompt group rolls out
    listed = httpx.get(
        f"{gw.server.url}/api/v1/tasks", params={"uid": "demo"}, headers=auth(gw.key), timeout=30
    )
    assert [t["uid"] for t in listed.json()["results"]] == ["demo"]
    # and: the last step carries is_last and the reward; the trajectory is complete
    # and: the earlier step is served the outcome as its branch's reward (its own is none)
    assert (steps[0]["is_last"], steps[0]["reward"], steps[0]["reward_scope"]) == (False, 1.0, "branch")
    assert (steps[1]["is_last"], steps[1]["reward"], steps[1]["reward_status"]) == (True, 1.0, "final")
    assert steps[1]["reward_scope"] == "step"
    t = trajectory_of(gw.server, gw.key, traj).json()
    assert (t["status"], t["reward"], t["channel"], t["metadata"]["task"]) == (
        "completed",
        1.0,
        "train",
        "demo",
    )

    # and: the ended trajectory takes no more calls (its capability URL stopped working)
    with pytest.raises(openai.AuthenticationError, match="completed"):
        llm.chat.completions.create(model=MODEL, messages=messages)
    assert len(steps_of(gw.server, gw.key, traj)) == 2


def test_streaming_through_the_claw_r1_base_url(gw):
    # given
    init = gw.post("init_trajectory").json()

    # when
    chunks = list(
        openai.OpenAI(base_url=init["base_url"], api_key=gw.key, max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "stream"}], stream=True
        )
    )

    # then
    [step] = steps_of(gw.server, gw.key, init["trajectory_uid"])
    assert step["response_text"] == "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_white_box_submit_steps_in_claw_r1_shape(gw):
    # given: Claw-R1 StepPayloads (prompt_uid, rollout_log_probs, its defaults)
    steps = [
        {
            "prompt_ids": [1, 2, 3],
            "response_ids": [4, 5],
            "rollout_log_probs": [-0.5, -0.25],
            "reward": None,
            "trajectory_uid": "wb-1",
            "prompt_uid": "wb-group",
            "step_index": 0,
            "policy_version": 2,
            "is_last": False,
            "multi_modal_data": None,
            "routed_experts": None,
        },
        {
            "prompt_ids": [1, 2, 3, 4, 5, 6],
            "response_ids": [7],
            "reward": 0.5,
            "trajectory_uid": "wb-1",
            "prompt_uid": "wb-group",
            "step_index": 1,
            "policy_version": 2,
            "is_last": True,
            "metadata": {"k": "v"},
        },
    ]

    # when
    r = gw.post("submit_steps", {"steps": steps}, params={"channel": "val"})

    # then
    assert r.status_code == 200 and r.json() == {"accepted": 2}
    s0, s1 = steps_of(gw.server, gw.key, "wb-1")
    assert (s0["prompt_ids"], s0["response_ids"], s0["rollout_logprobs"]) == (
        [1, 2, 3],
        [4, 5],
        [-0.5, -0.25],
    )
    assert s0["prompt_group_uid"] == "wb-group" and s0["policy_version"] == 2
    assert (s1["reward"], s1["is_last"], s1["metadata"]) == (0.5, True, {"k": "v"})
    assert trajectory_of(gw.server, gw.key, "wb-1").json()["channel"] == "val"
    # and: resubmitting is idempotent
    assert gw.post("submit_steps", {"steps": steps}, params={"channel": "val"}).json() == {"accepted": 2}
    assert len(steps_of(gw.server, gw.key, "wb-1")) == 2


def test_older_claw_r1_routes_are_served(gw):
    # given: an agent using the body-addressed register and the path-addressed complete
    init = gw.post("init_trajectory").json()
    traj = init["trajectory_uid"]

    # when
    reg = gw.post("register_trajectory", {"trajectory_uid": traj, "channel": "val"})
    openai.OpenAI(base_url=init["base_url"], api_key=gw.key, max_retries=0).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    done = gw.post(f"complete_trajectory/{traj}", {"reward": 0.25})

    # then
    assert reg.json() == done.json() == {"status": "ok"}
    t = trajectory_of(gw.server, gw.key, traj).json()
    assert (t["status"], t["reward"], t["channel"]) == ("completed", 0.25, "val")


def test_every_endpoint_requires_an_ingest_key(gw):
    # given: the key-authorised base URL of a real trajectory (not its capability URL) and a
    # read-only key
    traj = gw.post("init_trajectory").json()["trajectory_uid"]
    reader = gw.server.make_key("read")
    root = f"{gw.server.url}/compat/claw-r1"
    endpoints = [
        "init_trajectory",
        f"{traj}/g/v1/register_trajectory",
        f"{traj}/g/v1/chat/completions",
        f"{traj}/g/v1/complete_trajectory",
        "submit_steps",
    ]

    # when / then: in the header or in the path (a gateway URL), a missing or unknown key is
    # 401 and a key without the ingest scope 403
    for endpoint in endpoints:
        url = f"{root}/{endpoint}"
        assert httpx.post(url, json={}).status_code == 401, url
        assert httpx.post(url, json={}, headers=auth(reader)).status_code == 403, url
        assert httpx.post(f"{root}/k/claw_0_nope/{endpoint}", json={}).status_code == 401, url
        assert httpx.post(f"{root}/k/{reader}/{endpoint}", json={}).status_code == 403, url
    assert trajectory_of(gw.server, gw.key, traj).json()["status"] == "running"


def test_bad_input_is_answered_in_openai_error_shape(gw):
    r = gw.post(
        "submit_steps", {"steps": [{"trajectory_uid": "x", "prompt_ids": "nope", "response_ids": []}]}
    )
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("steps[0].prompt_ids")
    assert gw.post("complete_trajectory/does-not-exist", {}).status_code == 404
