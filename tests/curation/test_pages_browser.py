"""Operator pages in a real browser: Playwright driving the system Chromium against a live
server process (sign in through the admin, pool home, admin step filter, Swagger UI; the
curation builder's live preview and save)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from tests.live import LiveServer, live_server

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]


SETUP = """
from django.contrib.auth import get_user_model
from pool.services.api_keys import api_key_create
get_user_model().objects.create_superuser("op", "op@example.com", "browser-pw-1")
print(api_key_create(name="browser-agent", scopes=["ingest"])[1])
"""


@pytest.fixture
def server(tmp_path) -> Iterator[LiveServer]:
    """A live server with an operator account and three steps (one with a final reward)."""
    var_dir = tmp_path / "srv"
    var_dir.mkdir()
    with live_server(var_dir) as srv:
        # One Django start for both (each manage.py call costs a second or two).
        out = srv.manage("shell", "-c", SETUP)
        key = out.strip().splitlines()[-1]
        steps = [
            {
                "trajectory_uid": "b-t",
                "step_index": i,
                "prompt_ids": [1, 2, 3, i],
                "response_ids": [4, 5],
                **({"reward": 1.0} if i == 1 else {}),
            }
            for i in range(3)
        ]
        resp = httpx.post(
            f"{srv.url}/api/v1/steps", json={"steps": steps}, headers={"Authorization": f"Bearer {key}"}
        )
        assert resp.status_code == 201, resp.text
        yield srv


@pytest.fixture
def browser_page(tmp_path) -> Iterator[tuple]:
    """A Chromium page in a fresh, empty profile, and the list of every URL it requested."""
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tmp_path / "profile"
    profile.mkdir()
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            user_data_dir=str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
        )
        requested: list[str] = []
        context.on("request", lambda req: requested.append(req.url))
        try:
            page = context.pages[0] if context.pages else context.new_page()
            page.set_default_timeout(20_000)
            yield page, requested
        finally:
            context.close()


def test_operator_pages_in_a_browser(server, browser_page, tmp_path: Path):
    page, requested = browser_page
    # given the operator signs in through the admin login page
    page.goto(f"{server.url}/admin/login/?next=/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "browser-pw-1")
    page.click("input[type=submit]")
    page.wait_for_url(f"{server.url}/")
    # then the pool home shows the step count
    assert page.locator('[data-stat="steps"]').inner_text().strip() == "3"
    assert "op" in page.locator("header .who").inner_text()

    # when the admin's step list is filtered by reward status "final"
    page.goto(f"{server.url}/admin/pool/step/")
    assert page.locator("#result_list tbody tr").count() == 3
    page.locator("#changelist-filter").get_by_role("link", name="final", exact=True).click()
    page.wait_for_url("**reward_status__exact=final**")
    # then only the rewarded step is listed
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "b-t:1" in rows.first.inner_text()

    # when the API docs page is opened
    page.goto(f"{server.url}/api/v1/docs/")
    # then Swagger UI rendered the schema's operations
    page.wait_for_selector(".swagger-ui .information-container .title")
    assert "Claw-R1 API" in page.locator(".swagger-ui .information-container .title").inner_text()
    # (counted once rendered: the first operation can be on the page before the last)
    page.wait_for_function("document.querySelectorAll('.opblock').length >= 10")
    assert page.locator(".opblock-summary-path", has_text="/api/v1/steps").count() >= 1

    # and a screenshot of it is written
    shot = tmp_path / "docs.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 1000

    # and the browser never contacted anything but the local server (assets are vendored)
    hosts = {urlparse(u).hostname for u in requested if urlparse(u).scheme in ("http", "https", "ws", "wss")}
    assert hosts and hosts <= LOCAL_HOSTS, hosts


def test_curation_builder_previews_live_and_saves(server, browser_page):
    from playwright.sync_api import expect

    page, _ = browser_page
    # given the operator signs in on the pages' own sign-in page
    page.goto(f"{server.url}/curation/")
    page.wait_for_url("**/login/?next=/curation/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "browser-pw-1")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{server.url}/curation/")
    # the three steps' trajectory is still running: nothing is ready
    expect(page.locator('[data-preview="steps"]')).to_have_text("0")
    # when the builder admits any stored step, per step
    page.select_option("#id_readiness", "any")
    page.uncheck("#id_keep_groups_whole")
    # then the counts follow without a reload
    expect(page.locator('[data-preview="steps"]')).to_have_text("3")
    expect(page.locator("#id_spec")).to_have_value(re.compile('"readiness": "any"'))
    # and a bad value is named by its field
    page.fill("#id_min_rollouts", "0")
    expect(page.locator("#preview-error")).to_contain_text("grouping.min_rollouts")
    page.fill("#id_min_rollouts", "")
    expect(page.locator("#preview-error")).to_be_hidden()
    # and the serving order and reuse budget go into the spec (reuse nested in serving)
    page.select_option("#id_order", "priority")
    page.select_option("#id_priority", "reward_std")
    page.fill("#id_max_uses", "2")
    expect(page.locator("#id_spec")).to_have_value(re.compile(r'"reuse": \{\s*"max_uses": 2\s*\}'))
    expect(page.locator("#preview-error")).to_be_hidden()
    # when it is saved as a dataset
    page.fill("#id_name", "explore")
    page.get_by_role("button", name="Save dataset").click()
    # then the dataset page shows version 1 and the same numbers
    page.wait_for_url(f"{server.url}/curation/datasets/explore/")
    expect(page.locator('[data-version="1"]')).to_contain_text("created by op")
    expect(page.locator('[data-preview="steps"]')).to_have_text("3")
    expect(page.locator(".serving-rules")).to_contain_text("up to 2 uses of a unit per consumer")
