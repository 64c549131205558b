"""Gateway URLs and trajectory capability URLs, end to end: a Claw-R1 black-box agent and
its trainer-side flow, both written the way Claw-R1 writes them (no credentials anywhere:
``init_trajectory`` posted bare, the OpenAI client with ``api_key="not-needed"``), work
against ``{site}/compat/claw-r1/k/{key}`` with no other change. A trajectory token authorises
its own trajectory only, until it completes or expires; keys and tokens never reach the log.

The server runs through ``manage.py serve`` (the production entry, which hands the project's
logging to uvicorn) with uvicorn's access log on, so the log check covers access lines,
Django's request warnings and error bodies.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.proxy_support import auth, steps_of, trajectory_of, upstream_ids
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"


# --- an agent and a flow written like Claw-R1's (not imported: Claw-R1 is not a dependency) --
CHECK_ANSWER_TOOL = {
    "type": "function",
    "function": {
        "name": "check_answer",
        "description": "Check if your answer to the math problem is correct.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "Your final numerical answer"}},
            "required": ["answer"],
        },
    },
}
TOOL_CALL_REGEX = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_tool_calls(content: str) -> list[dict]:
    """``<tool_call>`` blocks of raw model output (Qwen style), as Claw-R1's agent parses them."""
    calls = []
    for match in TOOL_CALL_REGEX.findall(content):
        try:
            parsed = json.loads(match)
            calls.append({"name": parsed["name"], "arguments": parsed["arguments"], "id": None})
        except (json.JSONDecodeError, KeyError, TypeError):
            pass
    return calls


def check_answer(answer: str, ground_truth: str) -> str:
    if answer.strip() == ground_truth:
        return "Correct! Your answer is right."
    return "Incorrect. Your answer is wrong, please try again."


class GSM8KStyleAgent:
    """Claw-R1's GSM8KAgent (claw_r1/blackbox_agent/gsm8k_agent.py), rewritten: a stateless
    agent that knows nothing of trajectories, steps or rewards. All it gets is a base URL;
    its key is ``"not-needed"``. Tool calls come as ``<tool_call>`` text or, from a server
    with a tool parser (the demo upstream), as OpenAI ``tool_calls``."""

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self.client = openai.AsyncOpenAI(base_url=self.base_url, api_key="not-needed", timeout=600.0)

    async def solve(self, question: str, ground_truth: str, max_turns: int = 3) -> int:
        messages: list[dict] = [{"role": "user", "content": question}]
        turns_used = 0
        for turn in range(max_turns):
            turns_used = turn + 1
            resp = await self.client.chat.completions.create(
                model=MODEL, messages=messages, tools=[CHECK_ANSWER_TOOL]
            )
            message = resp.choices[0].message
            content = message.content or ""
            tool_calls = parse_tool_calls(content) + [
                {"name": c.function.name, "arguments": json.loads(c.function.arguments), "id": c.id}
                for c in message.tool_calls or ()
            ]
            messages.append(message.model_dump(exclude_none=True))
            if not tool_calls:
                break
            for tc in tool_calls:
                if tc["name"] == "check_answer":
                    result = check_answer(str(tc["arguments"].get("answer", "")), ground_truth)
                    messages.append({"role": "tool", "tool_call_id": tc["id"], "content": result})
        await self.client.close()
        return turns_used


@dataclass
class Episode:
    trajectory_uid: str
    base_url: str
    turns: int
    init: httpx.Response
    register: httpx.Response
    complete: httpx.Response


async def run_flow(
    gateway_url: str, *, prompt_uid: str, channel: str, metadata: dict[str, Any], reward: float
) -> Episode:
    """The calls of Claw-R1's BlackBoxAgentFlowBase.run (claw_r1/blackbox_agent/
    blackbox_agent_flow.py), in its order and shape: init_trajectory with no body and no
    headers; the default prompt uid of the returned base URL replaced by the real one
    (``rsplit("/", 2)``); register_trajectory; the agent; complete_trajectory (here with the
    reward, as Claw-R1's gateway accepts it). The answers are returned to be checked."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        init_resp = await http.post(f"{gateway_url}/init_trajectory")
        init_resp.raise_for_status()
        base_url_from_init = init_resp.json()["base_url"]
        parts = base_url_from_init.rsplit("/", 2)  # [...base, prompt_uid, "v1"]
        base_url = f"{parts[0]}/{prompt_uid}/v1"
        reg_body = {"channel": channel, "metadata": metadata}
        register = await http.post(
            f"{base_url}/register_trajectory",
            content=json.dumps(reg_body).encode(),
            headers={"content-type": "application/json"},
        )
    try:
        turns = await GSM8KStyleAgent(base_url).solve("What is 6 * 7?", "42")
    finally:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as http:
            complete = await http.post(f"{base_url}/complete_trajectory", json={"reward": reward})
    return Episode(init_resp.json()["trajectory_uid"], base_url, turns, init_resp, register, complete)


# --- fixtures ------------------------------------------------------------------------------------
@dataclass
class Gateway:
    server: LiveServer
    key: str  # ingest + read: the source's key, and how the test reads back
    upstream: str
    secrets: list[str] = field(default_factory=list)  # every key and token seen: never in the log

    @property
    def gateway_url(self) -> str:
        """What a Claw-R1 user sets as its gateway_url: the key is in the path."""
        return f"{self.server.url}/compat/claw-r1/k/{self.key}"

    def init(self) -> dict[str, str]:
        r = httpx.post(f"{self.gateway_url}/init_trajectory", timeout=30)
        assert r.status_code == 200, r.text
        self.secrets.append(token_of(r.json()["base_url"]))
        return r.json()

    def episode(self, **kw: Any) -> Episode:
        params = {
            "prompt_uid": f"gsm8k-{uuid.uuid4().hex[:8]}",
            "channel": "train",
            "metadata": {},
            "reward": 1.0,
        }
        ep = asyncio.run(run_flow(self.gateway_url, **{**params, **kw}))
        self.secrets.append(token_of(ep.base_url))
        return ep


def token_of(base_url: str) -> str:
    """The token segment of a capability base URL ``.../c/<token>/<traj>/<prompt>/v1``."""
    parts = base_url.split("/")
    return parts[parts.index("c") + 1]


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    env = {"CLAW_UPSTREAM_URL": demo_upstream, "CLAW_UVICORN_LOG_LEVEL": "info"}
    with live_server(tmp_path_factory.mktemp("capability"), env, serve=True) as server:
        key = server.make_key("ingest", "read")
        yield Gateway(server, key, demo_upstream, secrets=[key])


def chat(base_url: str, **kw: Any) -> Any:
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=30, **kw)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def swap_trajectory(base_url: str, trajectory_uid: str) -> str:
    """``base_url`` with its trajectory segment replaced (the token kept)."""
    head, _, prompt_uid, v1 = base_url.rsplit("/", 3)
    return f"{head}/{trajectory_uid}/{prompt_uid}/{v1}"


# --- tests ----------------------------------------------------------------------------------------
def test_a_claw_r1_flow_and_agent_work_unmodified_through_the_gateway_url(gw):
    # given: Claw-R1's flow and agent, with only the gateway URL set (the key in its path)
    prompt_uid = f"gsm8k-{uuid.uuid4().hex[:8]}"

    # when: one episode, as BlackBoxAgentFlowBase.run drives it
    ep = gw.episode(prompt_uid=prompt_uid, metadata={"policy_version": 4, "task": "gsm8k"}, reward=0.5)

    # then: every call was answered as Claw-R1's gateway answers
    init = ep.init.json()
    token = token_of(init["base_url"])
    head, traj_segment, default_prompt_uid, v1 = init["base_url"].rsplit("/", 3)
    assert (head, traj_segment, v1) == (f"{gw.server.url}/compat/claw-r1/c/{token}", ep.trajectory_uid, "v1")
    assert ep.base_url == f"{head}/{ep.trajectory_uid}/{prompt_uid}/v1" and default_prompt_uid != prompt_uid
    assert len(token) >= 32 and gw.key not in init["base_url"]  # 192 random bits, base64url
    assert ep.register.status_code == 200 and ep.register.json() == {"status": "ok"}
    assert ep.complete.status_code == 200 and ep.complete.json() == {"status": "ok"}
    assert ep.turns == 2  # a tool call, then an answer
    # and: the steps hold the upstream's exact ids, the group from the URL, the registered version
    steps = steps_of(gw.server, gw.key, ep.trajectory_uid)
    assert [s["step_index"] for s in steps] == [0, 1]
    for step in steps:
        expected = upstream_ids(
            gw.upstream, {"model": MODEL, "messages": step["messages"], "tools": [CHECK_ANSWER_TOOL]}
        )
        assert step["prompt_ids"] == expected["prompt_token_ids"]
        assert step["response_ids"] == expected["choices"][0]["token_ids"]
        assert step["token_source"] == "upstream"
        assert step["prompt_group_uid"] == prompt_uid
        assert step["policy_version"] == 4
    assert steps[0]["messages"] == [{"role": "user", "content": "What is 6 * 7?"}]
    assert steps[0]["finish_reason"] == "tool_calls"  # then an answer: stop, or length at 32 tokens
    assert steps[1]["finish_reason"] in ("stop", "length") and steps[1]["response_text"]
    assert steps[1]["messages"][: len(steps[0]["messages"])] == steps[0]["messages"]
    assert steps[1]["messages"][-1]["role"] == "tool"
    # and: the last step carries is_last and the reward; the trajectory is complete
    # and: the earlier step is served the outcome as its branch's reward (its own is none)
    assert (steps[0]["is_last"], steps[0]["reward"], steps[0]["reward_scope"]) == (False, 0.5, "branch")
    assert (steps[1]["is_last"], steps[1]["reward"], steps[1]["reward_status"]) == (True, 0.5, "final")
    assert steps[1]["reward_scope"] == "step"
    t = trajectory_of(gw.server, gw.key, ep.trajectory_uid).json()
    assert (t["status"], t["reward"], t["prompt_group_uid"], t["metadata"]["task"]) == (
        "completed",
        0.5,
        prompt_uid,
        "gsm8k",
    )


def test_every_compat_endpoint_is_served_under_the_gateway_url(gw):
    # given: two trajectories opened through the gateway URL, no header anywhere
    black, white = gw.init(), gw.init()
    step = {
        "prompt_ids": [1, 2, 3],
        "response_ids": [4],
        "trajectory_uid": white["trajectory_uid"],
        "prompt_uid": "g-white",
        "step_index": 0,
    }

    # when: the body- and path-addressed endpoints and a keyed base URL are used
    submitted = httpx.post(f"{gw.gateway_url}/submit_steps?channel=train", json={"steps": [step]}, timeout=30)
    registered = httpx.post(
        f"{gw.gateway_url}/register_trajectory",
        json={"trajectory_uid": black["trajectory_uid"], "channel": "val"},
        timeout=30,
    )
    reply = chat(f"{gw.gateway_url}/{black['trajectory_uid']}/g-keyed/v1")
    completed = httpx.post(f"{gw.gateway_url}/complete_trajectory/{black['trajectory_uid']}", timeout=30)

    # then
    assert submitted.status_code == 200 and submitted.json() == {"accepted": 1}
    assert registered.json() == completed.json() == {"status": "ok"}
    assert reply.choices[0].message.content
    [s] = steps_of(gw.server, gw.key, black["trajectory_uid"])
    assert (s["prompt_group_uid"], s["token_source"]) == ("g-keyed", "upstream")
    t = trajectory_of(gw.server, gw.key, black["trajectory_uid"]).json()
    assert (t["status"], t["channel"]) == ("completed", "val")
    [w] = steps_of(gw.server, gw.key, white["trajectory_uid"])
    assert (w["prompt_ids"], w["prompt_group_uid"]) == ([1, 2, 3], "g-white")


def test_init_trajectory_binds_no_group_the_first_call_does_and_another_is_a_conflict(gw):
    # given: a trajectory opened bare
    opened = gw.init()
    assert trajectory_of(gw.server, gw.key, opened["trajectory_uid"]).json()["prompt_group_uid"] is None
    head = opened["base_url"].rsplit("/", 2)[0]

    # when: the first call (a chat, no register) names a prompt uid in the URL
    chat(f"{head}/g-first/v1")

    # then: it binds the group; another prompt uid later is refused, by register and by chat
    [step] = steps_of(gw.server, gw.key, opened["trajectory_uid"])
    assert step["prompt_group_uid"] == "g-first"
    other = f"{head}/g-other/v1"
    assert httpx.post(f"{other}/register_trajectory", json={}, timeout=30).status_code == 409
    with pytest.raises(openai.ConflictError):
        chat(other)
    assert len(steps_of(gw.server, gw.key, opened["trajectory_uid"])) == 1


def test_a_token_cannot_touch_another_trajectory(gw):
    # given: two open trajectories; A's base URL with B's trajectory uid swapped in
    a, b = gw.init(), gw.init()
    forged = swap_trajectory(a["base_url"], b["trajectory_uid"])

    # when / then: every endpoint refuses it, and B is untouched
    for endpoint in ("register_trajectory", "complete_trajectory", "trajectory/complete"):
        r = httpx.post(f"{forged}/{endpoint}", json={"reward": 1.0}, timeout=30)
        assert r.status_code == 403, (endpoint, r.text)
        assert r.json()["error"]["code"] == "permission_denied"
    with pytest.raises(openai.PermissionDeniedError):
        chat(forged)
    assert httpx.get(f"{forged}/models", timeout=30).status_code == 403
    assert steps_of(gw.server, gw.key, b["trajectory_uid"]) == []
    assert trajectory_of(gw.server, gw.key, b["trajectory_uid"]).json()["status"] == "running"
    # and: a uid that does not exist is refused the same way (nothing is created)
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    with pytest.raises(openai.PermissionDeniedError):
        chat(swap_trajectory(a["base_url"], ghost))
    assert trajectory_of(gw.server, gw.key, ghost).status_code == 404


def test_a_completed_trajectorys_token_is_refused(gw):
    # given: a finished episode
    ep = gw.episode()

    # when / then: its base URL no longer works, for any endpoint
    with pytest.raises(openai.AuthenticationError, match="completed"):
        chat(ep.base_url)
    for endpoint in ("register_trajectory", "complete_trajectory"):
        r = httpx.post(f"{ep.base_url}/{endpoint}", json={}, timeout=30)
        assert r.status_code == 401 and "completed" in r.json()["error"]["message"], r.text
    assert len(steps_of(gw.server, gw.key, ep.trajectory_uid)) == 2


def test_a_wrong_token_is_refused_whatever_the_authorization_header(gw):
    # given: a real trajectory's base URL with its token replaced
    opened = gw.init()
    token = token_of(opened["base_url"])
    wrong = opened["base_url"].replace(token, "x" * len(token))

    # when / then: 401, even with a valid API key in the header (the header is ignored)
    with pytest.raises(openai.AuthenticationError, match="not known"):
        chat(wrong)
    for headers in ({}, auth(gw.key)):
        r = httpx.post(f"{wrong}/register_trajectory", json={}, headers=headers, timeout=30)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_capability"
    # and: the real token with a bogus header still works
    assert chat(opened["base_url"], default_headers={"Authorization": "Bearer nonsense"}).choices


def test_an_expired_token_is_refused(gw):
    # given: an open trajectory whose token's stored expiry is moved into the past
    opened = gw.init()
    chat(opened["base_url"])
    gw.server.manage(
        "shell",
        "-c",
        "from datetime import timedelta; from django.utils import timezone; "
        "from pool.models import TrajectoryCapability as C; "
        f"assert C.objects.filter(trajectory__uid={opened['trajectory_uid']!r})"
        ".update(expires_at=timezone.now() - timedelta(seconds=1)) == 1",
    )

    # when / then: 401 with a clear message; the trajectory itself still runs
    with pytest.raises(openai.AuthenticationError, match="expired"):
        chat(opened["base_url"])
    r = httpx.post(f"{opened['base_url']}/complete_trajectory", json={}, timeout=30)
    assert r.status_code == 401 and "expired" in r.json()["error"]["message"]
    assert trajectory_of(gw.server, gw.key, opened["trajectory_uid"]).json()["status"] == "running"


def test_the_openai_door_returns_a_capability_base_url(gw):
    # given: a trajectory created through the REST API with an ingest key
    uid = f"oa-{uuid.uuid4().hex[:8]}"
    r = httpx.post(
        f"{gw.server.url}/api/v1/trajectories",
        json={"uid": uid, "prompt_group_uid": "oa-group"},
        headers=auth(gw.key),
        timeout=30,
    )
    assert r.status_code == 201
    base_url = r.json()["base_url"]
    gw.secrets.append(token_of(base_url))
    assert base_url.startswith(f"{gw.server.url}/t/c/") and base_url.endswith(f"/{uid}/oa-group/v1")

    # when: any OpenAI-compatible agent is given only that URL
    client = openai.OpenAI(base_url=base_url, api_key="not-needed", max_retries=0, timeout=30)
    models = client.models.list()
    messages = [{"role": "user", "content": "Say hi."}]
    client.chat.completions.create(model=MODEL, messages=messages)

    # then: the step is recorded in that trajectory and group, with the upstream's ids
    [step] = steps_of(gw.server, gw.key, uid)
    expected = upstream_ids(gw.upstream, {"model": MODEL, "messages": messages})
    assert step["prompt_ids"] == expected["prompt_token_ids"]
    assert step["response_ids"] == expected["choices"][0]["token_ids"]
    assert (step["token_source"], step["prompt_group_uid"]) == ("upstream", "oa-group")
    assert [m.id for m in models.data] == [MODEL]
    # and: the token is scoped to that trajectory, and dies with it
    other = httpx.post(
        f"{gw.server.url}/api/v1/trajectories", json={}, headers=auth(gw.key), timeout=30
    ).json()
    gw.secrets.append(token_of(other["base_url"]))
    with pytest.raises(openai.PermissionDeniedError):
        chat(swap_trajectory(base_url, other["uid"]))
    done = httpx.post(
        f"{gw.server.url}/api/v1/trajectories/{uid}/complete", json={}, headers=auth(gw.key), timeout=30
    )
    assert done.status_code == 200
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model=MODEL, messages=messages)
    # and: reading the trajectory back never shows a token
    assert "base_url" not in trajectory_of(gw.server, gw.key, uid).json()


def test_keys_and_tokens_never_reach_the_server_log_or_error_bodies(gw):
    # given: traffic that logs paths: an episode, refusals (Django's request warnings), an
    # unknown endpoint under the gateway URL and under a capability URL
    ep = gw.episode()
    opened = gw.init()
    refused = httpx.post(f"{ep.base_url}/register_trajectory", json={}, timeout=30)
    unknown_keyed = httpx.post(f"{gw.gateway_url}/no/such/endpoint", timeout=30)
    unknown_capability = httpx.post(f"{opened['base_url']}/embeddings", json={}, timeout=30)
    bad_key = httpx.post(f"{gw.server.url}/compat/claw-r1/k/claw_0000_{'y' * 43}/init_trajectory", timeout=30)

    # then: error bodies name the path with the secret masked
    assert refused.status_code == 401 and bad_key.status_code == 401
    assert unknown_keyed.status_code == unknown_capability.status_code == 404
    assert "/compat/claw-r1/k/***/no/such/endpoint" in unknown_keyed.json()["error"]["message"]
    assert "/compat/claw-r1/c/***/" in unknown_capability.json()["error"]["message"]
    for r in (refused, unknown_keyed, unknown_capability, bad_key):
        assert not any(secret in r.text for secret in gw.secrets)
    # and: the log has the access lines and request warnings of these calls, masked, and no
    # key or token of this module's tests
    log = wait_for_log(gw.server, "Unauthorized: /compat/claw-r1/k/***/init_trajectory")
    assert '"POST /compat/claw-r1/k/***/init_trajectory HTTP/1.1" 200' in log
    assert "/compat/claw-r1/c/***/" in log and "Unauthorized: /compat/claw-r1/c/***/" in log
    assert "claw_0000_" not in log
    leaked = [secret for secret in gw.secrets if secret in log]
    assert leaked == [], f"{len(leaked)} secret(s) in {gw.server.log_path}"
    assert len(gw.secrets) >= 4


def wait_for_log(server: LiveServer, needle: str, timeout: float = 30) -> str:
    """The server's log once it contains ``needle`` (written as the response goes out)."""
    deadline = time.monotonic() + timeout
    while True:
        log = server.log_path.read_text(errors="replace")
        if needle in log or time.monotonic() > deadline:
            assert needle in log, f"{needle!r} not in the log:\n{log[-4000:]}"
            return log
        time.sleep(0.05)
