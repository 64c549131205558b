"""The trace view (/trajectories/<uid>/) and the step page: an agent's chat steps with a tool
call, sent through the API (the one write pipeline), read back as turns showing only their
new messages, the tool call with its formatted arguments, the tool result, the effective
reward with its scope as the API serves it, metadata as a JSON tree, why a step is not ready
(one table, curation/selectors/readiness_explain.py), and the token view decoded with the
demo's toy tokenizer (CLAW_TOKENIZER=demo)."""

from __future__ import annotations

import html as htmllib
import json
import re

import pytest

from claw_site.demo.hf_toy import HFToyTokenizer
from claw_site.demo.toy_tokenizer import END, canonical_tool_calls, compact_json
from curation.selectors.readiness_explain import Facts, explain
from pool.flags import READY, Readiness
from pool.models import Scope, Step
from pool.services.api_keys import api_key_create
from tests.conftest import client_for
from tests.curation.test_pages import signed_in

pytestmark = pytest.mark.django_db

TOY = HFToyTokenizer()
SYSTEM = {"role": "system", "content": "You are a weather agent. Use the tools."}
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALLS = [
    {
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps({"unit": "C", "city": "Paris"})},
    }
]
CALL = {"role": "assistant", "content": None, "tool_calls": CALLS}
TOOL = {"role": "tool", "tool_call_id": "call_7", "content": json.dumps({"temp_c": 21, "sky": "clear"})}
ANSWER = "It is 21 °C and clear in Paris."
META = {"zeta": {"nested": [1, 2]}, "alpha": "it's 'quoted'", "model": "toy-agent-1"}


def agent_steps(traj: str, *, tool_calls_in: str) -> list[dict]:
    """Two white-box steps: a tool call (no content), then the final answer after the tool's
    result. The reply's tool calls are in the step's metadata (as the proxy stores them) or
    only echoed back in the next prompt (``tool_calls_in``)."""
    p0 = TOY.apply_chat_template([SYSTEM, USER], add_generation_prompt=True)
    r0 = TOY.encode(compact_json(canonical_tool_calls(CALLS))) + [END]
    p1 = TOY.apply_chat_template([SYSTEM, USER, CALL, TOOL], add_generation_prompt=True)
    r1 = TOY.encode(ANSWER) + [END]
    meta0 = {**META, **({"tool_calls": CALLS} if tool_calls_in == "metadata" else {})}
    return [
        {
            "trajectory_uid": traj,
            "prompt_group_uid": f"{traj}-group",
            "step_index": 0,
            "prompt_ids": p0,
            "response_ids": r0,
            "rollout_logprobs": [-0.01 * (k % 50) for k in range(len(r0))],
            "messages": [SYSTEM, USER],
            "metadata": meta0,
            "finish_reason": "tool_calls",
            "reward": 0.25,
        },
        {
            "trajectory_uid": traj,
            "prompt_group_uid": f"{traj}-group",
            "step_index": 1,
            "prompt_ids": p1,
            "response_ids": r1,
            "rollout_logprobs": [-3.0 + 0.1 * (k % 30) for k in range(len(r1))],
            "messages": [SYSTEM, USER, CALL, TOOL],
            "response_text": ANSWER,
            "metadata": {"model": "toy-agent-1"},
            "finish_reason": "stop",
            "is_last": True,
        },
    ]


def turn_of(page: str, index: int) -> str:
    start = page.index(f'id="step-{index}"')
    end = page.find('<li class="step', start + 1)
    return page[start : end if end > 0 else len(page)]


@pytest.mark.parametrize("tool_calls_in", ["metadata", "echo"])
def test_trace_view_shows_turns_tool_calls_rewards_and_metadata(tool_calls_in):
    # given: an agent's two chat steps through the API, the trajectory completed with a reward
    agent = client_for(api_key_create(name="agent", scopes=[Scope.INGEST, Scope.READ])[1])
    sent = agent_steps("weather", tool_calls_in=tool_calls_in)
    resp = agent.post("/api/v1/steps", {"steps": sent}, format="json")
    assert resp.status_code == 201, resp.content
    resp = agent.post("/api/v1/trajectories/weather/complete", {"reward": 1.0}, format="json")
    assert resp.status_code == 200, resp.content
    served = {i: agent.get(f"/api/v1/steps/weather:{i}").json() for i in (0, 1)}

    # when: a reviewer opens the trace view
    page = signed_in("reviewer").get("/trajectories/weather/").content.decode()
    text = htmllib.unescape(page)

    # then: the system prompt appears once (step 1 shows only the tool's result as new)
    assert text.count(SYSTEM["content"]) == 1 and text.count(USER["content"]) == 1
    t0, t1 = turn_of(page, 0), turn_of(page, 1)
    assert 'data-prompt="full"' in t0 and 'data-prompt="new"' in t1
    assert "since step 0" in t1 and SYSTEM["content"] not in t1
    # and the tool-call answer shows the tool's name and its arguments pretty-printed (sorted)
    args = htmllib.unescape(re.search(r'<pre class="tool-args">(.*?)</pre>', t0, re.S).group(1))
    assert 'data-tool="get_weather"' in t0 and '<code class="tool-name">get_weather</code>' in t0
    assert args == json.dumps({"city": "Paris", "unit": "C"}, indent=2)
    assert "text unknown" not in text and "null" not in htmllib.unescape(
        t0.split("Response", 1)[1].split("Tokens")[0]
    )
    # and the tool's result is drawn as a tree of its JSON, then the final answer
    assert 'data-role="tool"' in t1 and "result of call call_7" in t1
    result = t1[t1.index('class="tool-result"') :]
    assert '<span class="jt-k">&quot;temp_c&quot;</span>: <span class="jt-n">21</span>' in result
    assert ANSWER in htmllib.unescape(t1)
    # and each step's effective reward and scope are the API's
    for i, turn in ((0, t0), (1, t1)):
        badge = re.search(r'data-reward="([^"]*)" data-scope="([^"]*)"', turn)
        assert (float(badge.group(1)), badge.group(2)) == (served[i]["reward"], served[i]["reward_scope"])
    # step 0's own reward is a process reward; step 1 takes its branch's outcome, the
    # trajectory's reward (until issue 18 it took step 0's 0.25, scope branch)
    assert [served[0]["reward_scope"], served[1]["reward_scope"]] == ["step", "trajectory"]
    # and the two kinds apart, as the API serves them
    assert [(served[i]["outcome_reward"], served[i]["process_reward"]) for i in (0, 1)] == [
        (1.0, 0.25),
        (1.0, None),
    ]
    assert 'data-fact="process-reward"' in t0 and "process 0.25" in t0 and "outcome 1.0" in t0
    assert 'data-fact="process-reward"' not in t1 and "outcome 1.0" in t1
    # and model and token counts per turn
    assert 'data-fact="model">toy-agent-1<' in t0
    assert f"{len(sent[1]['prompt_ids'])} → {len(sent[1]['response_ids'])} tokens" in t1
    # and metadata is a JSON tree: keys sorted, strings in double quotes, no Python repr
    meta = t0[t0.index('class="metadata"') :]
    meta = htmllib.unescape(meta[: meta.index("</details></div></details>")])
    assert meta.index('"alpha"') < meta.index('"model"') < meta.index('"zeta"')
    assert "\"it's 'quoted'\"" in meta and "{'" not in meta
    # and the undeclared group is why nothing is ready, with what to do
    assert 'data-reason="group"' in t1 and "declares no expected_rollouts" in t1
    assert "POST /api/v1/groups" in t1 and 'data-reason="trajectory"' not in t1
    # and the top of the page counts the ready steps and gives each reason once
    assert 'data-fact="ready">0 of 2 steps<' in page
    summary = page[page.index('id="not-ready"') :]
    summary = summary[: summary.index("</section>")]
    assert summary.count('data-reason="group"') == 1 and summary.count("<li") == 1


def test_step_page_says_why_not_ready_and_shows_the_tool_call():
    # given: the same steps, the trajectory still running
    agent = client_for(api_key_create(name="agent", scopes=[Scope.INGEST])[1])
    steps = agent_steps("w2", tool_calls_in="metadata")
    steps[1]["is_last"] = False
    assert agent.post("/api/v1/steps", {"steps": steps}, format="json").status_code == 201
    step = Step.objects.get(uid="w2:0")
    # when: its step page is opened
    page = signed_in("reviewer").get(f"/steps/{step.id}/").content.decode()
    # then: it says the trajectory is running and how to end it, and shows the tool call
    assert 'data-reason="trajectory"' in page and "POST /api/v1/trajectories/w2/complete" in page
    assert '<code class="tool-name">get_weather</code>' in page and "Text unknown" not in page


def test_token_view_decodes_with_the_demo_tokenizer(settings):
    # given: CLAW_TOKENIZER=demo and the tool-call step
    settings.CLAW_TOKENIZER = "demo"
    agent = client_for(api_key_create(name="agent", scopes=[Scope.INGEST])[1])
    sent = agent_steps("w3", tool_calls_in="metadata")
    assert agent.post("/api/v1/steps", {"steps": sent}, format="json").status_code == 201
    step = Step.objects.get(uid="w3:0")
    # when: the token view asks for its tokens
    t = signed_in("reviewer").get(f"/steps/{step.id}/tokens").json()
    # then: the ids sent, each with its text, and the logprobs to colour them by
    assert t["prompt_ids"] == sent[0]["prompt_ids"] and t["response_ids"] == sent[0]["response_ids"]
    assert t["tokenizer"] == "demo"
    assert t["response_tokens"] == [TOY.token_text(i) for i in sent[0]["response_ids"]]
    assert "".join(t["response_tokens"][:-1]) == compact_json(canonical_tool_calls(CALLS))
    assert t["prompt_tokens"][0] == "<bos>" and t["response_tokens"][-1] == "<|end|>"
    assert t["response_logprobs"] == pytest.approx(sent[0]["rollout_logprobs"])
    # and the same tokenizer serves the pool's Hugging Face calls (retokenizing a chat call,
    # decoding a reward's text): the toy template's ids, as the demo upstream generates them
    from claw_kit.llm.tokenizer import chat_ids, get_tokenizer

    assert chat_ids(get_tokenizer(), [SYSTEM, USER], None, CALL) == (
        sent[0]["prompt_ids"],
        sent[0]["response_ids"],
    )
    assert get_tokenizer().decode(sent[1]["response_ids"], skip_special_tokens=True) == ANSWER
    # and without a tokenizer the texts are null (the page shows ids as chips)
    settings.CLAW_TOKENIZER = ""
    t = signed_in("operator").get(f"/steps/{step.id}/tokens").json()
    assert t["prompt_tokens"] is None and t["response_tokens"] is None and t["tokenizer"] is None


def _facts(**kw) -> Facts:
    base = {
        "readiness": READY,
        "trajectory_uid": "t",
        "trajectory_status": "completed",
        "token_source": "client",
        "reward": 1.0,
    }
    return Facts(**(base | kw))


NOT = {name: READY & ~int(bit) for name, bit in Readiness.__members__.items()}
# One row per reason: the facts, the reason codes given, and words of the explanation.
EXPLAIN_ROWS = [
    ("ready", _facts(), [], []),
    (
        "running",
        _facts(readiness=NOT["TRAJECTORY_COMPLETE"], trajectory_status="running"),
        ["trajectory"],
        ["trajectory still running", "is_last", "POST /api/v1/trajectories/t/complete"],
    ),
    (
        "failed",
        _facts(readiness=NOT["TRAJECTORY_COMPLETE"], trajectory_status="failed"),
        ["trajectory"],
        ["ended as failed", "only completed trajectories"],
    ),
    (
        "no reward",
        _facts(readiness=NOT["REWARD_FINAL"], reward=None),
        ["reward"],
        ["waiting for reward", "POST /api/v1/rewards"],
    ),
    (
        "reward not final",
        _facts(readiness=NOT["REWARD_FINAL"], reward=0.5),
        ["reward"],
        ["reward 0.5 is not final", "final: true"],
    ),
    (
        "process reward awaiting its branch's outcome",
        _facts(readiness=NOT["REWARD_FINAL"], reward=0.5, awaits_outcome=True),
        ["reward"],
        ["process reward 0.5: waiting for its branch's outcome", "final step"],
    ),
    (
        "undeclared group",
        _facts(readiness=NOT["GROUP_COMPLETE"], group_uid="g", group_status="open"),
        ["group"],
        ["declares no expected_rollouts", "POST /api/v1/groups", "expected_rollouts"],
    ),
    (
        "group waiting",
        _facts(
            readiness=NOT["GROUP_COMPLETE"],
            group_uid="g",
            group_status="open",
            group_expected=4,
            group_ended=1,
        ),
        ["group"],
        ["1 of 4 rollouts ended", "waiting for 3 more rollouts"],
    ),
    (
        "retokenized",
        _facts(readiness=NOT["TOKENS_EXACT"], token_source="retokenized"),
        ["tokens"],
        ["not exact (token source: retokenized)", "admits retokenized"],
    ),
    (
        "stale policy",
        _facts(policy_behind=3),
        ["staleness"],
        ["3 versions behind", "max_staleness below 3"],
    ),
    (
        "several",
        _facts(
            readiness=int(Readiness.TOKENS_EXACT), trajectory_status="running", reward=None, group_uid="g"
        ),
        ["trajectory", "reward", "group"],
        ["trajectory still running", "waiting for reward", "declares no expected_rollouts"],
    ),
]


@pytest.mark.parametrize(
    ("facts", "codes", "words"), [r[1:] for r in EXPLAIN_ROWS], ids=[r[0] for r in EXPLAIN_ROWS]
)
def test_why_a_step_is_not_ready(facts, codes, words):
    # given: a step's readiness facts; when: explained
    reasons = explain(facts)
    # then: one reason per missing fact, each saying why and what would make it ready
    assert [r.code for r in reasons] == codes
    said = " | ".join(f"{r.why}: {r.fix}" for r in reasons)
    for w in words:
        assert w in said, (w, said)
    assert all(r.why and r.fix for r in reasons)


ACCEPT_BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


@pytest.mark.parametrize(
    ("query", "accept", "page"),
    [
        ("", ACCEPT_BROWSER, True),  # a browser following the "replay" link
        ("?format=json", ACCEPT_BROWSER, False),  # the page's download link
        ("", "application/json", False),
        ("", "", False),  # no Accept (curl, scripts): the bytes as before
        ("?format=html", "application/json", True),
    ],
)
def test_lease_replay_is_a_page_for_browsers_and_json_otherwise(query, accept, page):
    # given: a served lease
    from curation.models import Lease
    from curation.services.consume import PullIn, consumer_pull
    from curation.services.datasets import dataset_create
    from tests.curation.test_pages import finished

    finished("t1")
    dataset_create(name="ds", spec={"filters": {"readiness": "any"}}, actor="setup")
    lease = consumer_pull(consumer="trainer-1", pull=PullIn(dataset="ds", batch_size=2, unit="steps"))
    body = bytes(Lease.objects.get(id=lease.id).body)
    # when: the replay is opened
    resp = signed_in("reviewer").get(f"/consumption/leases/{lease.id}/batch{query}", HTTP_ACCEPT=accept)
    # then: a page with the batch as a JSON tree and a link to the bytes, or the bytes
    assert resp.status_code == 200
    if page:
        html = resp.content.decode()
        assert resp["Content-Type"].startswith("text/html") and 'href="?format=json"' in html
        uids = [s["uid"] for s in json.loads(body)["batch"]["steps"]]
        assert uids and all(f"&quot;{u}&quot;" in html for u in uids)
    else:
        assert resp["Content-Type"] == "application/json" and resp.content == body


def test_a_text_completion_shows_its_prompt_and_text():
    # given: a text completion's step (no chat messages; the proxy keeps its prompt in metadata)
    agent = client_for(api_key_create(name="agent", scopes=[Scope.INGEST])[1])
    step = {
        "trajectory_uid": "comp",
        "step_index": 0,
        "prompt_ids": TOY.encode("Once upon a time"),
        "response_ids": TOY.encode(" there was"),
        "response_text": " there was",
        "metadata": {"endpoint": "completions", "prompt": "Once upon a time"},
    }
    assert agent.post("/api/v1/steps", {"steps": [step]}, format="json").status_code == 201
    # when: its trace is opened
    turn = turn_of(signed_in("reviewer").get("/trajectories/comp/").content.decode(), 0)
    # then: the prompt and the completion are shown as text, nothing "unknown"
    assert 'data-role="prompt"' in turn and "Once upon a time</pre>" in turn
    assert "there was</pre>" in turn and "text unknown" not in turn
