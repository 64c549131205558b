"""The dashboard in a real browser: Playwright driving the system Chromium against a live
server process. Every page is opened (and screenshotted under var/screenshots/, git-ignored),
a curation action is run, a snapshot's progress bar finishes, a group's prefix tree is drawn;
with the live websocket, a step posted through the API shows up on Collection and Overview
without a reload; script payloads in ingested data never run, on any page, live or not."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from tests.curation.test_pages_browser import CHROMIUM, CHROMIUM_ARGS
from tests.dashboard.traffic import api_counters
from tests.live import ROOT, LiveServer, live_server, start_celery_worker, stop_process

SCREENSHOTS = ROOT / "var" / "screenshots"
HAS_LIVE = (ROOT / "claw_site" / "static" / "claw" / "live.js").exists()
# A step posted through the API must be on the pages within this (the bound).
LIVE_DEADLINE_MS = 2_000

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]
needs_live = pytest.mark.skipif(not HAS_LIVE, reason="the live websocket (static/claw/live.js) is not built")

SETUP = """
from django.contrib.auth import get_user_model
from curation.services.datasets import dataset_create
from pool.services.api_keys import api_key_create
get_user_model().objects.create_superuser("op", "op@example.com", "browser-pw-1")
dataset_create(name="all", spec={"filters": {"readiness": "any"}, "grouping": {"keep_groups_whole": False}}, actor="op")
print(api_key_create(name="dash-agent", scopes=["ingest"])[1])
print(api_key_create(name="dash-trainer", scopes=["consume"], source_kind="trainer")[1])
"""

# Script payloads: each one, if it ever ran, sets window.__xss and opens a dialog.
XSS = [
    "<script>window.__xss=1;alert(1)</script>",
    '<img src=x onerror="window.__xss=2;alert(2)">',
    '"><svg onload="window.__xss=3;alert(3)">',
]
XSS_TEXT = " ".join(XSS)


class Api:
    """The server's REST API with one key."""

    def __init__(self, url: str, key: str):
        self.url, self.headers = url, {"Authorization": f"Bearer {key}"}

    def post(self, path: str, body: dict) -> dict:
        resp = httpx.post(f"{self.url}{path}", json=body, headers=self.headers, timeout=30)
        assert resp.status_code < 300, resp.text
        return resp.json()

    def get(self, path: str) -> dict:
        resp = httpx.get(f"{self.url}{path}", headers=self.headers, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def numbers(self) -> dict[str, int]:
        """The overview's counters as the API counts them (the stats and the step list)."""
        stats = self.get("/api/v1/stats")
        steps: list[dict] = []
        url: str | None = "/api/v1/steps?page_size=1000"
        while url:
            page = self.get(url)
            steps += page["results"]
            url = page["next"] and page["next"].removeprefix(self.url)
        return api_counters(stats, steps)


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[LiveServer, Api, Api]]:
    """A live server with an operator, a dataset over every step, a two-rollout prompt
    group (g1) and a one-step trajectory; the agent's and the trainer's API clients."""
    var_dir = tmp_path / "srv"
    var_dir.mkdir()
    # With REDIS_URL (CI's second run) snapshots are built by a Celery worker, on a private
    # queue so that no other run's worker takes them; its live events reach the page
    # through the Redis channel layer.
    queue = {"CLAW_CELERY_QUEUE": f"claw-dash-{uuid.uuid4().hex[:8]}"} if os.environ.get("REDIS_URL") else {}
    with live_server(var_dir, queue) as srv, celery_worker(srv, var_dir, queue):
        agent_key, trainer_key = srv.manage("shell", "-c", SETUP).strip().splitlines()[-2:]
        agent = Api(srv.url, agent_key)
        agent.post(
            "/api/v1/steps",
            {
                "steps": [
                    {
                        "trajectory_uid": f"g1-r{r}",
                        "prompt_group_uid": "g1",
                        "step_index": 0,
                        "prompt_ids": [5, 5, 5, 5, 5, 5],
                        "response_ids": [r + 1, r + 2],
                        "messages": [{"role": "user", "content": "what is five?"}],
                        "response_text": f"rollout {r}",
                        "reward": float(r),
                    }
                    for r in range(2)
                ]
            },
        )
        yield srv, agent, Api(srv.url, trainer_key)


@contextmanager
def celery_worker(srv: LiveServer, var_dir: Path, queue: dict[str, str]) -> Iterator[None]:
    """A solo Celery worker on ``queue``'s queue while the block runs (none without one)."""
    if not queue:
        yield
        return
    worker = start_celery_worker(srv.env, queue["CLAW_CELERY_QUEUE"], var_dir / "worker.log")
    try:
        yield
    finally:
        stop_process(worker)


@pytest.fixture
def browser(tmp_path):
    """A Chromium context in a fresh profile; every dialog any page opens is recorded."""
    sync_api = pytest.importorskip("playwright.sync_api")
    profile = tmp_path / "profile"
    profile.mkdir()
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            user_data_dir=str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        dialogs: list[str] = []

        def watch(page):
            page.set_default_timeout(20_000)
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

        context.on("page", watch)
        for page in context.pages:
            watch(page)
        try:
            yield context, dialogs
        finally:
            context.close()


def sign_in(page, url: str) -> None:
    page.goto(f"{url}/login/?next=/")
    page.fill("#id_username", "op")
    page.fill("#id_password", "browser-pw-1")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{url}/")


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000


def first_page(context):
    return context.pages[0] if context.pages else context.new_page()


def test_every_stage_page_in_a_browser(server, browser):
    from playwright.sync_api import expect

    srv, agent, _ = server
    context, dialogs = browser
    page = first_page(context)
    # given the operator signs in
    sign_in(page, srv.url)
    # then the overview counts the two stored steps and links every stage
    expect(page.locator('[data-live="collect.steps"]')).to_have_text("2")
    for name in ["Overview", "Trajectories", "Representation", "Curation", "Optimization", "Consumption"]:
        expect(page.locator("header nav").get_by_role("link", name=name, exact=True)).to_be_visible()
    expect(page.locator('#sources tr[data-source="dash-agent"]')).to_be_visible()
    expect(page.locator("#rate-chart polyline")).to_have_count(1)
    shot(page, "overview")

    # when the trajectory list is filtered by status
    page.get_by_role("link", name="Trajectories", exact=True).click()
    expect(page.locator("#trajectories tbody tr[data-uid]")).to_have_count(2)
    page.select_option("#id_status", "completed")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#trajectories tbody")).to_contain_text("No trajectories match these filters")
    page.goto(f"{srv.url}/trajectories/")
    shot(page, "collection")

    # when a step is inspected, with its token ids on demand
    page.get_by_role("link", name="Representation", exact=True).click()
    page.get_by_role("link", name="g1-r1:0").click()
    expect(page.locator(".response-text")).to_have_text("rollout 1")
    page.get_by_role("button", name="Show token ids").click()
    expect(page.locator("[data-tokens=response]")).to_have_text("2 3")
    expect(page.locator("[data-tokens=prompt]")).to_have_text("5 5 5 5 5 5")
    shot(page, "step")
    page.goto(f"{srv.url}/steps/")
    shot(page, "steps")

    # when the operator runs a curation action (accept every step of a trajectory)
    page.goto(f"{srv.url}/trajectories/g1-r0/")
    page.select_option("#id_action", "accepted")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("ul.messages")).to_contain_text("1 step(s) changed")
    # then Curation counts the labelled step
    page.get_by_role("link", name="Curation", exact=True).click()
    expect(page.locator('[data-live="curate.labelled"]')).to_have_text("1")
    shot(page, "curation")

    # when a group's prefix tree is opened
    page.get_by_role("link", name="Optimization", exact=True).click()
    page.locator("#groups").get_by_role("link", name="g1").click()
    # then the shared 6-token prompt is drawn once, with the two branches under it
    expect(page.locator("#prefix-tree rect.node")).to_have_count(3)
    expect(page.locator("#prefix-tree rect.node.shared")).to_have_count(1)
    expect(page.locator("#tree-list li.shared")).to_contain_text("shared by 2")
    expect(page.locator('[data-stat="saved"]')).to_have_text("38%")  # 6 of 16 tokens
    shot(page, "group")
    page.goto(f"{srv.url}/optimization/")
    expect(page.locator("#savings-chart rect.value")).to_have_count(1)
    shot(page, "optimization")

    # when a snapshot is frozen from Consumption
    page.get_by_role("link", name="Consumption", exact=True).click()
    expect(page.locator('[data-preview="steps"]')).to_have_text("2")
    page.get_by_role("button", name="Freeze a snapshot").click()
    # then its progress bar is full and its files are offered
    row = page.locator("#snapshot-rows tr[data-snapshot]").first
    expect(row.locator("[data-cell=status]")).to_have_text("done")
    expect(row.locator("progress")).to_have_js_property("position", 1)
    expect(row.get_by_role("link", name="jsonl")).to_be_visible()
    shot(page, "consumption")

    # and on a phone-sized screen the overview's stages stack and nothing overflows sideways
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(f"{srv.url}/")
    shot(page, "overview-narrow")
    wide = page.evaluate("""() => Array.from(document.querySelectorAll('body *'))
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
        .map(e => e.tagName + '.' + e.className + '#' + e.id).slice(0, 12)""")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), wide
    shot(page, "overview-narrow")
    assert dialogs == []


@needs_live
def test_a_step_posted_through_the_api_appears_live(server, browser):
    from playwright.sync_api import expect

    srv, agent, trainer = server
    context, _ = browser
    overview = first_page(context)
    sign_in(overview, srv.url)
    collection = context.new_page()
    collection.goto(f"{srv.url}/trajectories/")
    completed = context.new_page()
    completed.goto(f"{srv.url}/trajectories/?status=completed")
    consumption = context.new_page()
    consumption.goto(f"{srv.url}/consumption/")
    for page in (overview, collection, completed, consumption):
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(overview.locator('[data-live="collect.steps"]')).to_have_text("2")

    # when an agent posts a step of a new trajectory
    agent.post(
        "/api/v1/steps",
        {"steps": [{"trajectory_uid": "live-1", "step_index": 0, "prompt_ids": [1, 2], "response_ids": [3]}]},
    )
    # then, without a reload, Collection lists it and the Overview counts it
    expect(collection.locator('#trajectories tr[data-uid="live-1"]')).to_be_visible(timeout=LIVE_DEADLINE_MS)
    expect(overview.locator('[data-live="collect.steps"]')).to_have_text("3", timeout=LIVE_DEADLINE_MS)
    # and the overview's rate (from the `rate` events) shows steps flowing
    expect(overview.locator("#rate-now")).not_to_have_text("–", timeout=10_000)
    shot(collection, "collection-live")
    shot(overview, "overview-live")
    # and the page filtered on completed trajectories leaves the running one out
    expect(completed.locator("#trajectories tr[data-uid]")).to_have_count(0)

    # when the agent completes it, the filtered page lists it, live
    agent.post("/api/v1/trajectories/live-1/complete", {})
    expect(completed.locator('#trajectories tr[data-uid="live-1"] .badge')).to_have_text("completed")
    expect(collection.locator('#trajectories tr[data-uid="live-1"] .badge')).to_have_text("completed")

    # when a trainer freezes a snapshot through the API
    snap = trainer.post("/api/v1/snapshots", {"dataset": "all"})
    # then its row appears on Consumption and its progress bar finishes
    row = consumption.locator(f'#snapshot-rows tr[data-snapshot="{snap["id"]}"]')
    expect(row.locator("[data-cell=status]")).to_have_text("done")
    expect(row.locator("progress")).to_have_js_property("position", 1)
    shot(consumption, "consumption-live")


@needs_live
def test_the_overviews_numbers_after_live_updates_are_the_apis(server, browser):
    from playwright.sync_api import expect

    srv, agent, _ = server
    reader = Api(srv.url, srv.make_key("read", name="dash-reader"))
    context, _ = browser
    overview = first_page(context)
    sign_in(overview, srv.url)
    collection = context.new_page()
    collection.goto(f"{srv.url}/trajectories/")
    for page in (overview, collection):
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    before = reader.numbers()
    for path, value in before.items():
        expect(overview.locator(f'[data-live="{path}"]')).to_have_text(
            f"{value:,}" if isinstance(value, int) else str(value)
        )

    # when agents write while the pages are open: a two-rollout group, completed with
    # rewards (ready), a running trajectory and one completed without a reward
    agent.post("/api/v1/groups", {"uid": "bg", "expected_rollouts": 2})
    agent.post(
        "/api/v1/steps",
        {
            "steps": [
                {
                    "trajectory_uid": "bg-r0",
                    "prompt_group_uid": "bg",
                    "step_index": 0,
                    "prompt_ids": [1, 2],
                    "response_ids": [3],
                },
                {
                    "trajectory_uid": "bg-r0",
                    "prompt_group_uid": "bg",
                    "step_index": 1,
                    "prompt_ids": [1, 2, 3, 4],
                    "response_ids": [5],
                },
                {
                    "trajectory_uid": "bg-r1",
                    "prompt_group_uid": "bg",
                    "step_index": 0,
                    "prompt_ids": [1, 2],
                    "response_ids": [6],
                },
                {"trajectory_uid": "b-run", "step_index": 0, "prompt_ids": [7], "response_ids": [8]},
                {
                    "trajectory_uid": "b-nor",
                    "step_index": 0,
                    "prompt_ids": [7],
                    "response_ids": [9],
                    "is_last": True,
                },
            ]
        },
    )
    agent.post("/api/v1/trajectories/bg-r0/complete", {"reward": 1.0})
    agent.post("/api/v1/trajectories/bg-r1/complete", {"reward": 0.0})
    after = reader.numbers()
    assert after["collect.steps"] == before["collect.steps"] + 5
    assert after["curate.ready_steps"] == before["curate.ready_steps"] + 3
    assert after["collect.running"] == before["collect.running"] + 1
    # then, without a reload, every overview counter becomes the API's number
    for path, value in after.items():
        expect(overview.locator(f'[data-live="{path}"]')).to_have_text(
            f"{value:,}" if isinstance(value, int) else str(value), timeout=10_000
        )
    shot(overview, "overview-numbers")
    # and the live Collection rows name the group by its uid, linked to its page
    for uid in ("bg-r0", "bg-r1"):
        link = collection.locator(f'#trajectories tr[data-uid="{uid}"]').get_by_role(
            "link", name="bg", exact=True
        )
        expect(link).to_have_attribute("href", "/optimization/groups/bg/")


WRITE_WHILE_DOWN = """
from pool.ingest.contract import StepIn
from pool.ingest.pipeline import steps_ingest
import numpy as np
ids = lambda *v: np.array(v, dtype=np.int32)
steps_ingest(steps=[StepIn(trajectory_uid="offline", step_index=i, prompt_ids=ids(1, 2, i), response_ids=ids(3)) for i in range(2)])
"""


@needs_live
def test_a_page_that_loses_its_connection_reconnects_and_catches_up(server, browser):
    from playwright.sync_api import expect

    srv, _, _ = server
    context, _ = browser
    overview = first_page(context)
    sign_in(overview, srv.url)
    expect(overview.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(overview.locator('[data-live="collect.steps"]')).to_have_text("2")

    # when the server goes away, the page says so
    srv.stop()
    expect(overview.locator("#live-status")).to_have_attribute("data-state", "reconnecting")
    # and two steps are written while no server can tell the page (the pool's own service)
    srv.manage("shell", "-c", WRITE_WHILE_DOWN)

    # then once the server is back the page reconnects by itself and, without a reload,
    # counts the steps it missed (the hello state of the new connection)
    srv.start(migrate=False)
    expect(overview.locator("#live-status")).to_have_attribute("data-state", "live", timeout=30_000)
    expect(overview.locator('[data-live="collect.steps"]')).to_have_text("4")


def test_script_payloads_never_run(server, browser):
    from playwright.sync_api import expect

    srv, agent, _ = server
    context, dialogs = browser
    page = first_page(context)
    sign_in(page, srv.url)
    if HAS_LIVE:  # the payload also arrives through live events on an open page
        page.goto(f"{srv.url}/trajectories/")
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    # given a step whose ids, text and metadata hold script payloads, from a source (the
    # API key's name) that holds one too
    agent = Api(srv.url, srv.make_key("ingest", name="src" + XSS[0]))
    uid = "x" + XSS[1]
    agent.post(
        "/api/v1/steps",
        {
            "steps": [
                {
                    "trajectory_uid": uid,
                    "prompt_group_uid": "g" + XSS[2],
                    "step_index": 0,
                    "prompt_ids": [1, 2, 3],
                    "response_ids": [4],
                    "messages": [{"role": XSS[0], "content": XSS_TEXT}],
                    "response_text": XSS_TEXT,
                    "metadata": {"note": XSS_TEXT, XSS[2]: XSS[0]},
                    "finish_reason": "stop",
                }
            ]
        },
    )
    if HAS_LIVE:
        expect(page.locator("#trajectories tr[data-uid]").first).to_have_attribute("data-uid", uid)
        assert page.evaluate("window.__xss") is None
    # when every page that shows the payloads is opened
    pages = ["/", "/trajectories/", "/steps/", "/curation/", "/optimization/", "/consumption/"]
    pages += [f"/trajectories/{quote(uid)}/", f"/optimization/groups/{quote('g' + XSS[2])}/"]
    page.goto(f"{srv.url}/steps/")
    page.locator("#steps tbody tr").first.get_by_role("link").first.click()
    page.wait_for_url("**/steps/*/")
    pages.append(page.url.removeprefix(srv.url))
    for url in pages:
        page.goto(f"{srv.url}{url}")
        page.wait_for_load_state("load")
        # then the payloads are shown as text and never run
        assert page.evaluate("window.__xss") is None, url
        assert page.locator("script:not([src])").count() == 0, url
    expect(page.locator("pre.response-text")).to_have_text(XSS_TEXT)
    shot(page, "xss-step")
    assert dialogs == [], dialogs


@needs_live
def test_a_step_written_after_the_steps_page_loaded_is_a_linked_row_with_its_tokens(server, browser):
    from playwright.sync_api import expect

    srv, agent, _ = server
    reader = Api(srv.url, srv.make_key("read", name="steps-reader"))
    context, _ = browser
    page = first_page(context)
    sign_in(page, srv.url)
    page.goto(f"{srv.url}/steps/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    # when an agent posts a step with 1,234 prompt tokens after the page loaded
    agent.post(
        "/api/v1/steps",
        {
            "steps": [
                {
                    "trajectory_uid": "live-steps",
                    "step_index": 0,
                    "prompt_ids": [i % 50 for i in range(1234)],
                    "response_ids": [1, 2, 3],
                }
            ]
        },
    )
    stored = next(
        s
        for s in reader.get("/api/v1/steps?page_size=1000")["results"]
        if s["trajectory_uid"] == "live-steps"
    )
    # then, without a reload, its row links to the step and to its trajectory and shows the
    # API's token counts, with separators
    row = page.locator("#steps tbody tr.live-new").filter(has_text=stored["uid"])
    expect(row).to_have_count(1, timeout=LIVE_DEADLINE_MS)
    tokens = f"{len(stored['prompt_ids']):,} + {len(stored['response_ids']):,}"
    assert tokens == "1,234 + 3"
    expect(row.locator("[data-cell=tokens]")).to_have_text(tokens)
    expect(row.get_by_role("link", name="live-steps", exact=True)).to_have_attribute(
        "href", "/trajectories/live-steps/"
    )
    shot(page, "steps-live")
    # and the step link opens that step's page
    row.get_by_role("link", name=stored["uid"], exact=True).click()
    page.wait_for_url("**/steps/*/")
    expect(page.locator("body")).to_contain_text(stored["uid"])
    # and a reload renders the same row the same way
    page.goto(f"{srv.url}/steps/")
    expect(
        page.locator("#steps tbody tr").filter(has_text=stored["uid"]).locator("[data-cell=tokens]")
    ).to_have_text(tokens)


SHOT_PAGES = [
    ("overview", "/"),
    ("trajectories", "/trajectories/"),
    ("steps", "/steps/"),
    ("group", "/optimization/groups/g1/"),  # merged on open: the optimization page shows it
    ("group-big", "/optimization/groups/a-prompt-group-with-a-long-uid-42/"),
    ("optimization", "/optimization/"),
    ("consumption", "/consumption/"),
    ("admin-steps", "/admin/pool/step/"),
    ("api-docs", "/api/v1/docs/"),
]


# Layout only (widths and screenshots): CI's PostgreSQL pass skips it (backend_independent).
@pytest.mark.backend_independent
@pytest.mark.parametrize("width", [1440, 390])
def test_every_page_fits_the_width_and_is_screenshotted(server, browser, width):
    from playwright.sync_api import expect

    srv, agent, trainer = server
    context, dialogs = browser
    page = first_page(context)
    # given a pool with a merged group, a source, a big step and a trainer that pulled
    long_group = "a-prompt-group-with-a-long-uid-42"
    agent.post(
        "/api/v1/steps",
        {
            "steps": [
                {
                    "trajectory_uid": "big",
                    "step_index": 0,
                    "prompt_ids": [3] * 1500,
                    "response_ids": [4] * 1200,
                },
                *(
                    {
                        "trajectory_uid": f"an-agent-runtime-trajectory-with-a-long-uid-{r}",
                        "prompt_group_uid": long_group,
                        "step_index": 0,
                        "prompt_ids": [7] * 2048,
                        "response_ids": [r] * 300,
                        "is_last": True,
                    }
                    for r in range(4)
                ),
            ]
        },
    )
    trainer.post("/api/v1/consumers/shots/pull", {"dataset": "all", "batch_size": 1, "unit": "steps"})
    page.set_viewport_size({"width": width, "height": 900})
    sign_in(page, srv.url)
    failed: list[str] = []
    page.on("response", lambda r: failed.append(r.url) if r.status >= 400 else None)
    for name, url in SHOT_PAGES:
        # when each page is opened at this width
        page.goto(f"{srv.url}{url}")
        page.wait_for_load_state("load")
        # then nothing on it overflows the page sideways (tables scroll inside their box)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"), (name, width)
        shot(page, f"page-{name}-{width}")
    # and no page asked for anything that failed (the favicon included)
    assert failed == [], failed
    # and the trainer, a consumer only, is not among the data sources
    page.goto(f"{srv.url}/")
    expect(page.locator("#sources tr[data-source]")).to_have_count(1)
    expect(page.locator('#sources tr[data-source="dash-agent"]')).to_be_visible()
    # and the API docs list the gateway's doors
    page.goto(f"{srv.url}/api/v1/docs/")
    expect(page.locator("#operations-gateway-gateway_chat_completions")).to_be_visible()
    expect(page.locator("#operations-gateway-gateway_scoped_responses")).to_be_visible()
    shot(page, f"page-api-docs-{width}")
    if width == 1440:
        # and the admin's step list shows its readiness and quality columns inside the page
        page.goto(f"{srv.url}/admin/pool/step/")
        results = page.locator("#changelist .results").bounding_box()
        assert results is not None
        for column in ("readiness_short", "quality_short", "created_short"):
            box = page.locator(f"#result_list th.column-{column}").bounding_box()
            assert box is not None and box["x"] + box["width"] <= results["x"] + results["width"] + 1, (
                column,
                box,
            )
        # and nothing in the list scrolls out of its box
        assert page.evaluate(
            "(e => e.scrollWidth <= e.clientWidth)(document.querySelector('#changelist .results'))"
        )
    assert dialogs == []
