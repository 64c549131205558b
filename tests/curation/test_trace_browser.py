"""The trace view in a real browser (Chromium through Playwright) on a live server with the
demo tokenizer (CLAW_TOKENIZER=demo), fed by an official OpenAI SDK agent through the gateway
to the demo upstream (300 ms a call): the tool call and its result, the latency the door
measured, a metadata tree expanded, the token view opened (decoded tokens coloured by
logprob, ids on hover), and screenshots var/screenshots/trace-1440.png and trace-390.png."""

from __future__ import annotations

import json
import os
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import openai
import pytest

from claw_site.demo.toy_tokenizer import ToyTokenizer
from tests.curation.test_pages_browser import CHROMIUM, browser_page  # noqa: F401 - a fixture
from tests.gateway.conftest import slow_upstream  # noqa: F401 - a fixture
from tests.gateway.proxy_support import steps_of
from tests.live import live_server

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

TOY = ToyTokenizer()
SETUP = """
from django.contrib.auth import get_user_model
get_user_model().objects.create_superuser("op", "op@example.com", "browser-pw-1")
"""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


def test_trace_view_at_1440(tmp_path, browser_page, slow_upstream):  # noqa: F811 - the fixtures
    from playwright.sync_api import expect

    # given: an SDK agent's tool call, the tool's result and the final answer, through the gateway
    (tmp_path / "srv").mkdir()
    env = {"CLAW_TOKENIZER": "demo", "CLAW_UPSTREAM_URL": slow_upstream}
    with live_server(tmp_path / "srv", env) as srv:
        srv.manage("shell", "-c", SETUP)
        key = srv.make_key("ingest", "read")
        agent = openai.OpenAI(
            base_url=f"{srv.url}/v1",
            api_key=key,
            max_retries=0,
            timeout=30,
            default_headers={"X-Claw-Trajectory": "trace-b"},
        )
        messages = [
            {"role": "system", "content": "You are a weather agent."},
            {"role": "user", "content": "Weather in Paris?"},
        ]
        first = agent.chat.completions.create(model="claw-demo", messages=messages, tools=TOOLS)
        call = first.choices[0].message.tool_calls[0]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})},
        ]
        agent.chat.completions.create(model="claw-demo", messages=messages, tools=TOOLS)
        s0, s1 = steps_of(srv, key, "trace-b")
        assert s0["response_text"] is None and s0["metadata"]["tool_calls"]

        # when: the operator opens the trace view at 1440 px
        page, _ = browser_page
        page.set_viewport_size({"width": 1440, "height": 1000})
        page.goto(f"{srv.url}/login/?next=/trajectories/trace-b/")
        page.fill("#id_username", "op")
        page.fill("#id_password", "browser-pw-1")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/trajectories/trace-b/")
        step0, step1 = page.locator("#step-0"), page.locator("#step-1")
        # then: the tool call with its arguments, the result as the next turn's only new message
        expect(step0.locator(".tool-name")).to_have_text(call.function.name)
        assert json.loads(step0.locator("pre.tool-args").inner_text()) == json.loads(call.function.arguments)
        expect(step1.locator(".turn.prompt .msg")).to_have_count(1)
        expect(step1.locator(".turn.prompt .msg")).to_have_attribute("data-role", "tool")
        expect(page.get_by_text("You are a weather agent.", exact=True)).to_have_count(1)
        # and each call's latency as the door measured it (the upstream takes 300 ms)
        for loc, s in ((step0, s0), (step1, s1)):
            assert s["metadata"]["latency_ms"] >= 300
            # whole milliseconds, halves rounded up as the page's floatformat does (not Python's half-to-even)
            shown = Decimal(repr(s["metadata"]["latency_ms"])).quantize(Decimal(1), rounding=ROUND_HALF_UP)
            expect(loc.locator('[data-fact="latency"]')).to_have_text(f"{shown} ms")

        # when: step 0's metadata tree is expanded
        step0.locator("details.metadata > summary").click()
        # then: its keys show, sorted and quoted
        keys = step0.locator("details.metadata .json-tree > details > ul > li > .jt-k")
        expect(keys.first).to_be_visible()
        assert keys.all_inner_texts() == [json.dumps(k) for k in sorted(s0["metadata"])]

        # when: the token view of step 0 is opened
        step0.locator("details.token-view > summary").click()
        chips = step0.locator("[data-tokens=response] .tok")
        expect(chips).to_have_count(len(s0["response_ids"]))
        # then: each response token is its decoded text, coloured by its logprob, its id on hover
        ids = [int(i) for i in chips.evaluate_all("es => es.map(e => e.dataset.id)")]
        assert ids == s0["response_ids"]
        texts = chips.evaluate_all("es => es.map(e => e.title)")
        lp = s0["rollout_logprobs"]
        assert texts[0] == f"id {ids[0]} · logprob {lp[0]:.3f} (p {2.718281828459045 ** lp[0]:.3f})"
        assert all(t.startswith(f"id {i} ") for t, i in zip(texts, ids, strict=True))
        expect(chips.nth(1)).to_have_text(TOY.token_text(ids[1]))
        colours = chips.evaluate_all("es => es.map(e => e.style.backgroundColor)")
        assert all(colours)
        expect(step0.locator(".tok-scale")).to_be_visible()
        # and nothing is wider than the window
        assert page.evaluate("document.documentElement.scrollWidth") <= 1440
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "trace-1440.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 900})
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        page.screenshot(path=str(SCREENSHOTS / "trace-390.png"), full_page=True)

        # when: step 0's own page is opened and its tokens shown
        page.set_viewport_size({"width": 1440, "height": 1000})
        step0.get_by_role("link", name="Step 0").click()
        page.wait_for_url("**/steps/*/")
        # then: it says why the step is not ready, shows the tool call and the decoded tokens
        expect(page.locator('#readiness [data-reason="trajectory"]')).to_contain_text(
            "trajectory still running"
        )
        expect(page.locator(".tool-name")).to_have_text(call.function.name)
        page.get_by_role("button", name="Show token ids").click()
        expect(page.locator("[data-tokens=response] .tok")).to_have_count(len(s0["response_ids"]))
        page.screenshot(path=str(SCREENSHOTS / "trace-step-1440.png"), full_page=True)
