"""The trace view in a real browser (Chromium through Playwright, the live server of
tests/live.py with CLAW_TOKENIZER=demo): a tool-call trajectory at 1440 px, a metadata tree
expanded, the token view opened (decoded tokens coloured by logprob, ids on hover), and a
screenshot saved as var/screenshots/trace-1440.png."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from tests.curation.test_pages_browser import CHROMIUM, browser_page  # noqa: F401 - a fixture
from tests.curation.test_trace_view import TOY, agent_steps
from tests.live import live_server

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

SETUP = """
from django.contrib.auth import get_user_model
from pool.services import api_key_create
get_user_model().objects.create_superuser("op", "op@example.com", "browser-pw-1")
print(api_key_create(name="trace-agent", scopes=["ingest"])[1])
"""
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"


def test_trace_view_at_1440(tmp_path, browser_page):  # noqa: F811 - the fixture
    from playwright.sync_api import expect

    # given: a live server with the demo tokenizer and the agent's tool-call trajectory
    (tmp_path / "srv").mkdir()
    with live_server(tmp_path / "srv", {"CLAW_TOKENIZER": "demo"}) as srv:
        key = srv.manage("shell", "-c", SETUP).strip().splitlines()[-1]
        sent = agent_steps("trace-b", tool_calls_in="metadata")
        resp = httpx.post(
            f"{srv.url}/api/v1/steps", json={"steps": sent}, headers={"Authorization": f"Bearer {key}"}
        )
        assert resp.status_code == 201, resp.text
        page, _ = browser_page
        page.set_viewport_size({"width": 1440, "height": 1000})
        page.goto(f"{srv.url}/login/?next=/trajectories/trace-b/")
        page.fill("#id_username", "op")
        page.fill("#id_password", "browser-pw-1")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_url("**/trajectories/trace-b/")
        step0 = page.locator("#step-0")
        expect(step0.locator(".tool-name")).to_have_text("get_weather")

        # when: step 0's metadata tree is expanded
        step0.locator("details.metadata > summary").click()
        # then: its keys show, sorted and quoted
        keys = step0.locator("details.metadata .json-tree > details > ul > li > .jt-k")
        expect(keys.first).to_be_visible()
        assert keys.all_inner_texts() == [json.dumps(k) for k in sorted(sent[0]["metadata"])]

        # when: the token view of step 0 is opened
        step0.locator("details.token-view > summary").click()
        chips = step0.locator("[data-tokens=response] .tok")
        expect(chips).to_have_count(len(sent[0]["response_ids"]))
        # then: each response token is its decoded text, coloured by its logprob, id on hover
        first = chips.first
        expect(first).to_have_text(TOY.token_text(sent[0]["response_ids"][0]))
        second = chips.nth(1)  # logprob -0.01 as sent
        expect(second).to_have_attribute(
            "title", f"id {sent[0]['response_ids'][1]} · logprob -0.010 (p 0.990)"
        )
        colours = chips.evaluate_all("es => es.map(e => e.style.backgroundColor)")
        assert all(colours) and len(set(colours)) > 1  # a scale, not one colour
        ids = [int(i) for i in chips.evaluate_all("es => es.map(e => e.dataset.id)")]
        assert ids == sent[0]["response_ids"]
        expect(step0.locator(".tok-scale")).to_be_visible()
        # and no part of the page is wider than the window
        assert page.evaluate("document.documentElement.scrollWidth") <= 1440
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "trace-1440.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 900})
        page.screenshot(path=str(SCREENSHOTS / "trace-390.png"), full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1
