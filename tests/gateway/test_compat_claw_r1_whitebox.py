"""Claw-R1's white-box agent flows, unmodified: MultiStepAgentFlow's exact HTTP calls
(claw_r1/agent_flow/agent_flow.py's gateway_generate, gateway_compute_reward and
gateway_submit_steps: same paths, same bodies, no credentials) replayed against a live server
through a source's gateway URL ``/compat/claw-r1/k/<key>``, with the demo upstream behind it.

The flow's tokenizer is the demo upstream's own (its /tokenize and /detokenize), as Claw-R1's
is the served model's."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

import httpx
import pytest

from tests.gateway.proxy_support import auth, steps_of, trajectory_of, upstream_ids
from tests.live import LiveServer, live_server, refused_port, start_celery_worker, stop_process

pytestmark = pytest.mark.live

# claw_r1/agent_flow/multi_step_agent_flow.py
FEEDBACK_PROMPT = (
    "Please verify your answer step by step and provide the final answer again in the format #### <number>."
)
RESPONSE_LENGTH = 256  # its rollout.response_length: the flow cuts ids and logprobs to it


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str

    @property
    def gateway_url(self) -> str:
        """What Claw-R1's AgentFlowBase is given as gateway_url: no header is ever sent."""
        return f"{self.server.url}/compat/claw-r1/k/{self.key}"

    def tokenize(self, messages: list[dict]) -> list[int]:
        root = self.upstream.removesuffix("/v1")
        r = httpx.post(
            f"{root}/tokenize", json={"messages": messages, "add_generation_prompt": True}, timeout=30
        )
        return r.json()["tokens"]

    def decode(self, ids: list[int]) -> str:
        root = self.upstream.removesuffix("/v1")
        return httpx.post(f"{root}/detokenize", json={"tokens": ids}, timeout=30).json()["prompt"]


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    """The server; with REDIS_URL (tasks go through the broker) a Celery worker on a private
    queue computes the pool's rewards, as in production; without it they run in-process."""
    var = tmp_path_factory.mktemp("claw-r1-wb")
    queue = f"claw-wb-{uuid4().hex[:8]}"  # private: no other run's worker takes its tasks
    env = {"CLAW_UPSTREAM_URL": demo_upstream, "CLAW_CELERY_QUEUE": queue}
    with live_server(var, env) as server:
        worker = None
        if os.environ.get("REDIS_URL"):
            worker = start_celery_worker(server.env, queue, var / "worker.log")
        try:
            yield Gateway(server, server.make_key("ingest", "read"), demo_upstream)
        finally:
            if worker is not None:
                stop_process(worker)


# --- Claw-R1's HTTP helpers, call for call (AgentFlowBase) -------------------------------------
def gateway_generate(gateway_url: str, prompt_ids: list[int], sampling_params: dict) -> httpx.Response:
    return httpx.post(
        f"{gateway_url}/generate",
        json={"prompt_ids": prompt_ids, "sampling_params": sampling_params},
        timeout=60,
    )


def gateway_compute_reward(
    gateway_url: str, prompt_ids, response_ids, num_turns: int = 2, extra_fields=None, dataset_fields=None
) -> httpx.Response:
    safe_dataset = {k: v for k, v in (dataset_fields or {}).items() if v is not None}
    return httpx.post(
        f"{gateway_url}/compute_reward",
        json={
            "prompt_ids": prompt_ids,
            "response_ids": response_ids,
            "num_turns": num_turns,
            "extra_fields": extra_fields or {},
            "dataset_fields": safe_dataset,
        },
        timeout=60,
    )


def gateway_submit_steps(gateway_url: str, steps: list[dict], channel: str | None = None) -> httpx.Response:
    params = {"channel": channel} if channel else None
    return httpx.post(f"{gateway_url}/submit_steps", json={"steps": steps}, params=params, timeout=60)


def step_payload(**s: Any) -> dict:
    """A claw_r1 Step as gateway_submit_steps sends it."""
    return {
        "prompt_ids": s["prompt_ids"],
        "response_ids": s["response_ids"],
        "reward": s.get("reward"),
        "rollout_log_probs": s["rollout_log_probs"],
        "trajectory_uid": s["trajectory_uid"],
        "prompt_uid": s["prompt_uid"],
        "step_index": s["step_index"],
        "policy_version": s["policy_version"],
        "is_last": s["is_last"],
        "metadata": s["metadata"],
    }


def multi_step_agent_flow(gw: Gateway, sampling_params: dict, **kwargs: Any) -> dict:
    """MultiStepAgentFlow.run, line for line (max_turns = 2); returns what it saw."""
    trajectory_uid = uuid4().hex
    prompt_uid = str(kwargs.get("uid", uuid4().hex))
    messages = list(kwargs["raw_prompt"])
    channel = kwargs.pop("channel", None)
    metadata = {k: v for k, v in kwargs.items() if k != "agent_name"}
    seen: dict[str, Any] = {"trajectory_uid": trajectory_uid, "generated": [], "prompts": []}
    for turn in range(2):
        prompt_ids = gw.tokenize(messages)
        r = gateway_generate(gw.gateway_url, prompt_ids, sampling_params)
        assert r.status_code == 200, r.text
        gen_result = r.json()
        seen["generated"].append(gen_result)
        seen["prompts"].append(prompt_ids)
        response_ids = gen_result["token_ids"][:RESPONSE_LENGTH]
        log_probs = gen_result.get("log_probs")
        if log_probs:
            log_probs = log_probs[:RESPONSE_LENGTH]
        is_last = turn == 1
        step = dict(
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            rollout_log_probs=log_probs,
            trajectory_uid=trajectory_uid,
            prompt_uid=prompt_uid,
            step_index=turn,
            policy_version=int(kwargs.get("policy_version", 0) or 0),
            is_last=is_last,
            metadata=metadata,
        )
        if not is_last:
            r = gateway_submit_steps(gw.gateway_url, [step_payload(**step)], channel=channel)
            assert r.status_code == 200 and r.json() == {"accepted": 1}, r.text
            messages.append({"role": "assistant", "content": gw.decode(response_ids)})
            messages.append({"role": "user", "content": FEEDBACK_PROMPT})
        else:
            dataset_fields = {k: v for k, v in kwargs.items() if k != "agent_name"}
            r = gateway_compute_reward(
                gw.gateway_url,
                prompt_ids,
                response_ids,
                num_turns=len(messages),
                dataset_fields=dataset_fields,
            )
            assert r.status_code == 200, r.text
            seen["reward"] = r.json()
            step["reward"] = seen["reward"]["reward_score"]
            r = gateway_submit_steps(gw.gateway_url, [step_payload(**step)], channel=channel)
            assert r.status_code == 200 and r.json() == {"accepted": 1}, r.text
    return seen


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, "logprobs": True}


def gsm8k_row(answer: str, uid: str) -> dict:
    """A verl gsm8k dataset row as the flow gets it (kwargs); the demo upstream answers the
    text after [demo-reply]."""
    return {
        "agent_name": "multi_step_agent",
        "data_source": "openai/gsm8k",
        "raw_prompt": [{"role": "user", "content": f"What is 6 * 7? [demo-reply]{answer}"}],
        "reward_model": {"ground_truth": "42", "style": "rule"},
        "ability": "math",
        "extra_info": {"split": "train", "index": 7},
        "uid": uid,
        "index": 7,
    }


def test_multi_step_agent_flow_runs_unmodified_with_exact_ids_and_a_gsm8k_reward(gw):
    # when: Claw-R1's MultiStepAgentFlow runs one gsm8k sample against the gateway URL
    seen = multi_step_agent_flow(gw, dict(SAMPLING), **gsm8k_row("6 * 7 = 42.\n#### 42", "wb-q7"))

    # then: /generate returned the upstream's exact ids, logprobs and stop reason
    for prompt_ids, gen in zip(seen["prompts"], seen["generated"], strict=True):
        direct = upstream_ids(
            gw.upstream,
            {
                "prompt": prompt_ids,
                "temperature": 1.0,
                "top_p": 1.0,
                "repetition_penalty": 1.0,
                "logprobs": 1,
            },
            endpoint="completions",
        )["choices"][0]
        assert gen == {
            "token_ids": direct["token_ids"],
            "log_probs": direct["logprobs"]["token_logprobs"],
            "stop_reason": direct["finish_reason"],
        }
        assert gw.decode(gen["token_ids"]) == "6 * 7 = 42.\n#### 42"
    # and: the pool's gsm8k function scored the answer
    assert seen["reward"]["reward_score"] == 1.0
    assert seen["reward"]["reward_extra_info"]["extracted"] == "42"
    assert seen["reward"]["reward_extra_info"]["function"] == "pool.rewards.builtin.gsm8k"

    # and: both steps are stored with the exact ids, the text the upstream gave, the reward on
    # the last one, and the trajectory completed by it
    steps = steps_of(gw.server, gw.key, seen["trajectory_uid"])
    assert [s["step_index"] for s in steps] == [0, 1]
    for step, prompt_ids, gen in zip(steps, seen["prompts"], seen["generated"], strict=True):
        assert step["prompt_ids"] == prompt_ids and step["response_ids"] == gen["token_ids"]
        assert step["rollout_logprobs"] == gen["log_probs"]
        assert step["response_text"] == "6 * 7 = 42.\n#### 42"
        assert step["prompt_group_uid"] == "wb-q7" and step["metadata"]["data_source"] == "openai/gsm8k"
    # and: the earlier step is served the outcome as its branch's reward (its own is none)
    assert (steps[0]["is_last"], steps[0]["reward"], steps[0]["reward_scope"]) == (False, 1.0, "branch")
    assert (steps[1]["is_last"], steps[1]["reward"], steps[1]["reward_status"]) == (True, 1.0, "final")
    assert steps[1]["reward_scope"] == "step"
    assert trajectory_of(gw.server, gw.key, seen["trajectory_uid"]).json()["status"] == "completed"


def test_a_wrong_answer_scores_zero(gw):
    seen = multi_step_agent_flow(gw, dict(SAMPLING), **gsm8k_row("It is 41.\n#### 41", "wb-q8"))
    assert seen["reward"]["reward_score"] == 0.0
    assert steps_of(gw.server, gw.key, seen["trajectory_uid"])[1]["reward"] == 0.0


def test_the_pool_computes_the_reward_of_a_last_step_submitted_without_one(gw):
    # given: a white-box agent that generates and submits its last step with no reward
    prompt_ids = gw.tokenize([{"role": "user", "content": "6 * 7? [demo-reply]#### 42"}])
    gen = gateway_generate(gw.gateway_url, prompt_ids, {}).json()
    step = step_payload(
        prompt_ids=prompt_ids,
        response_ids=gen["token_ids"],
        rollout_log_probs=None,
        trajectory_uid="wb-pool-scored",
        prompt_uid="wb-pool-group",
        step_index=0,
        policy_version=0,
        is_last=True,
        metadata={"data_source": "gsm8k", "reward_model": {"ground_truth": "42"}},
    )
    # when: it is submitted (the server runs tasks in-process: embedded mode)
    assert gateway_submit_steps(gw.gateway_url, [step]).status_code == 200
    # then: the pool scored it with the remembered text, as a final rule reward (after commit,
    # in-process or on the worker: waited for with a deadline)
    deadline = time.monotonic() + 60
    while True:
        [stored] = steps_of(gw.server, gw.key, "wb-pool-scored")
        if stored["reward_status"] == "final" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert (stored["reward"], stored["reward_source"], stored["reward_status"]) == (1.0, "rule", "final")
    assert trajectory_of(gw.server, gw.key, "wb-pool-scored").json()["reward"] == 1.0


def test_compute_reward_with_the_llm_judge_through_the_upstream(gw):
    prompt_ids = gw.tokenize([{"role": "user", "content": "[demo-reply]The answer is 42."}])
    gen = gateway_generate(gw.gateway_url, prompt_ids, {}).json()
    r = gateway_compute_reward(
        gw.gateway_url,
        prompt_ids,
        gen["token_ids"],
        dataset_fields={"data_source": "judge", "ground_truth": "42"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["reward_score"] == 1.0
    assert r.json()["reward_extra_info"]["judge"] == "ruler"


def test_sampling_params_map_to_the_upstream_and_max_tokens_cuts(gw):
    prompt_ids = gw.tokenize([{"role": "user", "content": "[demo-reply]" + "x" * 50}])
    r = gateway_generate(
        gw.gateway_url, prompt_ids, {"max_tokens": 5, "temperature": 0.5, "model": "claw-demo"}
    )
    assert r.status_code == 200, r.text
    direct = upstream_ids(
        gw.upstream, {"prompt": prompt_ids, "max_tokens": 5, "logprobs": 1}, endpoint="completions"
    )
    # the logprobs are asked and returned unasked (CLAW_UPSTREAM_LOGPROBS, on by default)
    assert r.json() == {
        "token_ids": direct["choices"][0]["token_ids"],
        "log_probs": direct["choices"][0]["logprobs"]["token_logprobs"],
        "stop_reason": "length",
    }
    assert len(r.json()["token_ids"]) == 5


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("generate", {"sampling_params": {}}, 400, "prompt_ids"),
        ("generate", {"prompt_ids": [1, "2"]}, 400, "prompt_ids"),
        ("generate", {"prompt_ids": []}, 400, "prompt_ids"),
        ("generate", {"prompt_ids": [1, 2], "sampling_params": []}, 400, "sampling_params"),
        (
            "generate",
            {"prompt_ids": [1, 2], "sampling_params": {"temperature": "hot"}},
            400,
            "sampling_params.temperature",
        ),
        (
            "generate",
            {"prompt_ids": [1, 2], "sampling_params": {"max_tokens": 0}},
            400,
            "sampling_params.max_tokens",
        ),
        ("compute_reward", {"response_ids": [1], "dataset_fields": {}}, 400, "dataset_fields.data_source"),
        (
            "compute_reward",
            {"response_ids": "abc", "dataset_fields": {"data_source": "gsm8k"}},
            400,
            "response_ids",
        ),
        ("compute_reward", {"response_ids": [1], "dataset_fields": [1]}, 400, "dataset_fields"),
        (
            "compute_reward",
            {"response_ids": [1], "num_turns": -1, "dataset_fields": {"data_source": "gsm8k"}},
            400,
            "num_turns",
        ),
        (
            "compute_reward",
            {"response_ids": [3, 4, 5, 6], "dataset_fields": {"data_source": "gsm8k"}},
            422,
            "response_ids",
        ),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(gw, path, body, status, param):
    r = httpx.post(f"{gw.gateway_url}/{path}", json=body, timeout=30)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_an_unknown_data_source_is_a_422_naming_it(gw):
    prompt_ids = gw.tokenize([{"role": "user", "content": "[demo-reply]#### 1"}])
    gen = gateway_generate(gw.gateway_url, prompt_ids, {}).json()
    r = gateway_compute_reward(
        gw.gateway_url, prompt_ids, gen["token_ids"], dataset_fields={"data_source": "nope"}
    )
    assert r.status_code == 422
    assert (
        r.json()["error"]["param"] == "dataset_fields.data_source" and "nope" in r.json()["error"]["message"]
    )


def test_upstream_faults_are_clear_json_errors(gw):
    url = f"{gw.gateway_url}/generate"
    body = {"prompt_ids": [1, 2, 3]}
    failed = httpx.post(url, json=body, headers={"x-demo-fail": "500"}, timeout=30)
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "upstream_error"
    refused = httpx.post(url, json=body, headers={"x-demo-fail": "400"}, timeout=30)
    assert refused.status_code == 400 and "the upstream answered 400" in refused.json()["error"]["message"]


def test_every_white_box_route_needs_a_key(gw):
    for path in ("generate", "compute_reward"):
        plain = httpx.post(f"{gw.server.url}/compat/claw-r1/{path}", json={"prompt_ids": [1]}, timeout=30)
        assert plain.status_code == 401
        wrong = httpx.post(f"{gw.server.url}/compat/claw-r1/k/claw_bad_key/{path}", json={}, timeout=30)
        assert wrong.status_code == 401
        bearer = httpx.post(
            f"{gw.server.url}/compat/claw-r1/{path}", json={}, headers=auth(gw.key), timeout=30
        )
        assert bearer.status_code == 400  # authorised; the empty body is refused naming its field


def test_an_upstream_without_token_ids_is_a_502_never_a_re_encoding(tmp_path, idless_upstream):
    # given: an upstream that ignores return_token_ids (a plain OpenAI server)
    with live_server(tmp_path, {"CLAW_UPSTREAM_URL": idless_upstream}) as server:
        key = server.make_key("ingest")
        # when
        r = httpx.post(
            f"{server.url}/compat/claw-r1/k/{key}/generate", json={"prompt_ids": [1, 2, 3]}, timeout=30
        )
    # then
    assert r.status_code == 502 and r.json()["error"]["code"] == "no_token_ids"


def test_an_unreachable_upstream_is_a_502(tmp_path):
    with (
        refused_port() as port,
        live_server(tmp_path, {"CLAW_UPSTREAM_URL": f"http://127.0.0.1:{port}"}) as server,
    ):
        key = server.make_key("ingest")
        r = httpx.post(
            f"{server.url}/compat/claw-r1/k/{key}/generate", json={"prompt_ids": [1, 2, 3]}, timeout=30
        )
    assert r.status_code == 502 and r.json()["error"]["code"] == "connect_error"
