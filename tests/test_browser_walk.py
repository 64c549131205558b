"""The three-role browser walk (issue 23, part 5): Playwright driving the system Chromium
against one live server filled through the real doors (an OpenAI SDK agent with a tool call
through the gateway to the demo upstream, a four-rollout group with rewards, a thousand steps,
an image step, review queues in item and group mode, a dataset with a consumer's lease).

ONE table of (role, page) rows. For each row, at 1440 px and at 390 px: the page answers as
curation/roles.py says (200 for a role that holds the permission, a redirect to a sign-in page
or a 403 otherwise), no console error, no failed request (the favicon included), nothing wider
than the window at 390 px (tables scroll inside their own box), and a full-page screenshot
var/screenshots/<role>-<page>-<width>.png (git-ignored) to look at. The overview's numbers
equal the API's, with thousands separators."""

from __future__ import annotations

import base64
import json
import os
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.curation.test_pages_browser import CHROMIUM, CHROMIUM_ARGS
from tests.dashboard.test_dashboard_browser import celery_worker
from tests.dashboard.traffic import api_counters
from tests.gateway.conftest import demo_upstream  # noqa: F401 - a fixture
from tests.live import ROOT, LiveServer, live_server
from tests.media_support import png

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

SCREENSHOTS = ROOT / "var" / "screenshots"
PASSWORD = "walk-browser-pw-1"
ROLES = ("reviewer", "operator", "admin")
# At 390 px the walk checks the layout (nothing wider than the window).
WIDTHS = ((1440, 900), (390, 844))
BULK_TRAJECTORIES, BULK_STEPS = 100, 10  # a thousand steps: the overview shows "1,0xx"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search_docs",
            "description": "Search the documentation",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]

# Users (one per role), review queues (item and group mode), a dataset; the keys last.
SETUP = """
from curation.services.datasets import dataset_create
from curation.services.review import review_queue_create
from curation.services.users import user_create
from pool.services.api_keys import api_key_create
for role, name in (("reviewer", "rev"), ("operator", "ope"), ("admin", "adm")):
    user_create(username=name, role=role, password=PASSWORD)
review_queue_create(name="walk-items", filters={"readiness": "any"}, label_choices=["correct", "wrong"],
    description="Every stored trajectory.", guidelines="## Rate\\n- **5**: right and clear\\n- **1**: wrong")
review_queue_create(name="walk-rank", filters={"readiness": "any"}, mode="group", group_reward="rank",
    guidelines="Rank **correct** answers first.")
dataset_create(name="walk-ds", spec={"filters": {"readiness": "any"}, "grouping": {"keep_groups_whole": False}},
    actor="ope")
print(api_key_create(name="walk-agent", scopes=["ingest", "read"])[1])
print(api_key_create(name="walk-trainer", scopes=["consume"], source_kind="trainer")[1])
"""
GROUPS = [
    (
        "walk-g",
        "What is the capital of Australia?",
        ["Canberra.", "Sydney.", "Canberra, since 1913.", "Melbourne, I think."],
    ),
    ("walk-g2", "What is 17 * 3?", ["51.", "17 * 3 = 51, since 17 * 3 = 10 * 3 + 7 * 3.", "54."]),
    ("walk-g3", "Name a prime above 90.", ["91.", "97 is prime.", "93."]),
]
USERS = {"reviewer": "rev", "operator": "ope", "admin": "adm"}


@dataclass
class Pool:
    srv: LiveServer
    agent_key: str
    step_id: int  # the SDK agent's first step (the tool call)
    lease_id: str

    def api(self, path: str) -> dict:
        resp = httpx.get(
            f"{self.srv.url}{path}", headers={"Authorization": f"Bearer {self.agent_key}"}, timeout=30
        )
        assert resp.status_code == 200, resp.text
        return resp.json()


def _post(srv: LiveServer, key: str, path: str, body: dict) -> dict:
    resp = httpx.post(f"{srv.url}{path}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert resp.status_code < 300, resp.text
    return resp.json()


def _populate(srv: LiveServer, agent_key: str, trainer_key: str) -> Pool:
    # an SDK agent through the gateway: a tool call, the tool's result, the final answer
    agent = openai.OpenAI(
        base_url=f"{srv.url}/v1",
        api_key=agent_key,
        max_retries=0,
        timeout=30,
        default_headers={"X-Claw-Trajectory": "agent-1"},
    )
    messages = [
        {"role": "system", "content": "You answer questions about Claw-R1 using its docs."},
        {"role": "user", "content": "How do I pull a batch?"},
    ]
    first = agent.chat.completions.create(model="claw-demo", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"hits": ["consumers/pull"]})},
    ]
    agent.chat.completions.create(model="claw-demo", messages=messages, tools=TOOLS)
    # an SDK agent sending a screenshot inside its message (the image sits in place on pages)
    screenshot = "data:image/png;base64," + base64.b64encode(png(31, (320, 200))).decode()
    agent.chat.completions.create(
        model="claw-demo",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is on this screen?"},
                    {"type": "image_url", "image_url": {"url": screenshot}},
                ],
            }
        ],
        extra_headers={"X-Claw-Trajectory": "walk-vision"},
    )
    # prompt groups of several rollouts, each completed with a reward (one per role for the
    # group-mode queue: an item claimed by one reviewer is not offered to another)
    # each group rolls out a registered task, so the tasks page has statistics to show
    tasks = [{"uid": f"task-{uid}", "set": "walk", "prompt": q, "ground_truth": a[0]} for uid, q, a in GROUPS]
    _post(srv, agent_key, "/api/v1/tasks", {"tasks": tasks})
    for uid, question, answers in GROUPS:
        _post(
            srv,
            agent_key,
            "/api/v1/groups",
            {"uid": uid, "expected_rollouts": len(answers), "task": f"task-{uid}"},
        )
        steps = [
            {
                "trajectory_uid": f"{uid}-r{r}",
                "prompt_group_uid": uid,
                "step_index": 0,
                "prompt_ids": [7, 7, 7, 7, 8, 9],
                "response_ids": [10 + r, 20 + r, 30 + r],
                "messages": [{"role": "user", "content": question}],
                "response_text": text,
                "is_last": True,
            }
            for r, text in enumerate(answers)
        ]
        _post(srv, agent_key, "/api/v1/steps", {"steps": steps})
        for r in range(len(answers)):
            _post(srv, agent_key, f"/api/v1/trajectories/{uid}-r{r}/complete", {"reward": float(r % 2 == 0)})
    # a thousand small steps, so that the overview's numbers need thousands separators
    bulk = [
        {
            "trajectory_uid": f"bulk-{t}",
            "step_index": i,
            "prompt_ids": [1, 2, 3, i],
            "response_ids": [4, 5],
            **({"reward": 0.5, "is_last": True} if i == BULK_STEPS - 1 else {}),
        }
        for t in range(BULK_TRAJECTORIES)
        for i in range(BULK_STEPS)
    ]
    for start in range(0, len(bulk), 250):
        _post(srv, agent_key, "/api/v1/steps", {"steps": bulk[start : start + 250]})
    # an image step, when the media door exists
    up = httpx.post(
        f"{srv.url}/api/v1/media",
        content=png(23, (320, 200)),
        headers={"Authorization": f"Bearer {agent_key}", "Content-Type": "image/png"},
    )
    if up.status_code == 201:
        step = {
            "trajectory_uid": "walk-image",
            "step_index": 0,
            "prompt_ids": [1, 2, 3],
            "response_ids": [4, 5],
            "messages": [{"role": "user", "content": "What is on this screen?"}],
            "response_text": "A chart.",
            "multi_modal_data": {"images": [{"sha256": up.json()["sha256"]}]},
        }
        _post(srv, agent_key, "/api/v1/steps", {"steps": [step]})
    # a consumer's lease on the dataset
    lease = _post(
        srv,
        trainer_key,
        "/api/v1/consumers/walk-c/pull",
        {"dataset": "walk-ds", "batch_size": 4, "unit": "steps"},
    )
    assert lease["lease_id"], lease
    # a training run whose checkpoint 1 took that lease (its pages: run, checkpoint)
    _post(srv, trainer_key, "/api/v1/runs", {"uid": "walk-run", "consumer": "walk-c", "dataset": "walk-ds"})
    _post(srv, trainer_key, f"/api/v1/leases/{lease['lease_id']}/ack", {})
    srv.manage(
        "shell",
        "-c",
        "from pool.services.policy import policy_version_set\npolicy_version_set(version=1, run='walk-run')",
    )
    step_id = int(
        srv.manage(
            "shell",
            "-c",
            "from pool.models import Step\nprint(Step.objects.get(trajectory__uid='agent-1', step_index=0).id)",
        )
        .strip()
        .splitlines()[-1]
    )
    return Pool(srv, agent_key, step_id, lease["lease_id"])


@pytest.fixture(scope="module")
def pool(tmp_path_factory, demo_upstream) -> Iterator[Pool]:  # noqa: F811 - the fixture
    var_dir = tmp_path_factory.mktemp("walk-srv")
    # With REDIS_URL (CI's second run) effects run on a Celery worker, on a private queue.
    queue = {"CLAW_CELERY_QUEUE": f"claw-walk-{uuid.uuid4().hex[:8]}"} if os.environ.get("REDIS_URL") else {}
    env = {"CLAW_TOKENIZER": "demo", "CLAW_UPSTREAM_URL": demo_upstream, **queue}
    with live_server(var_dir, env) as srv, celery_worker(srv, var_dir, queue):
        agent_key, trainer_key = (
            srv.manage("shell", "-c", f"PASSWORD = {PASSWORD!r}\n{SETUP}").strip().splitlines()[-2:]
        )
        yield _populate(srv, agent_key, trainer_key)


@pytest.fixture(scope="module")
def contexts(pool, tmp_path_factory) -> Iterator[dict]:
    """One signed-in Chromium context per role."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        out = {}
        try:
            for role in ROLES:
                context = browser.new_context(viewport={"width": 1440, "height": 900})
                page = context.new_page()
                page.set_default_timeout(20_000)
                page.goto(f"{pool.srv.url}/login/?next=/review/queues/")
                page.fill("#id_username", USERS[role])
                page.fill("#id_password", PASSWORD)
                page.get_by_role("button", name="Sign in").click()
                page.wait_for_url(f"{pool.srv.url}/review/queues/")
                page.close()
                out[role] = context
            yield out
        finally:
            browser.close()


# What a role gets: "ok" (200), "403" (signed in, not allowed) or "login" (sent to a sign-in page).
ALL = {"reviewer": "ok", "operator": "ok", "admin": "ok"}
CURATORS = {"reviewer": "403", "operator": "ok", "admin": "ok"}
# STAFF: a reviewer gets the site's 403 page, not the admin's sign-in form
STAFF = {"reviewer": "403", "operator": "ok", "admin": "ok"}


@dataclass(frozen=True)
class Row:
    name: str
    path: str  # may name {step_id}, {lease_id}
    access: dict[str, str]
    optional: bool = False  # runs only once its route exists (a feature still being merged)


PAGES = [
    Row("overview", "/", ALL),
    Row("trajectories", "/trajectories/", ALL),
    Row("trace", "/trajectories/agent-1/", ALL),
    Row("trace-group", "/trajectories/walk-g-r2/", ALL),
    Row("trace-image", "/trajectories/walk-image/", ALL),
    Row("steps", "/steps/", ALL),
    Row("step", "/steps/{step_id}/", ALL),
    Row("curation", "/curation/", CURATORS),
    Row("dataset", "/curation/datasets/walk-ds/", CURATORS),
    Row("optimization", "/optimization/", ALL),
    Row("group-tree", "/optimization/groups/walk-g/", ALL),
    Row("consumption", "/consumption/", ALL),
    Row("lease-batch", "/consumption/leases/{lease_id}/batch", ALL),
    Row("runs", "/runs/", ALL),
    Row("run", "/runs/walk-run/", ALL),
    Row("checkpoint", "/runs/walk-run/checkpoints/1/?to=1", ALL),
    Row("dataset-diff", "/curation/datasets/walk-ds/diff?from=1&to=1&side=kept", CURATORS),
    Row("review", "/review/walk-items/", ALL),
    Row("review-group", "/review/walk-rank/", ALL),
    Row("review-queues", "/review/queues/", ALL),
    Row("tasks", "/tasks/", ALL, optional=True),
    Row("admin", "/admin/", STAFF),
    Row("admin-steps", "/admin/pool/step/", STAFF),
    Row("api-docs", "/api/v1/docs/", ALL),
]
TABLE = [(role, row) for row in PAGES for role in ROLES]


def _route_exists(path: str) -> bool:
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        return False
    return True


# What the matrix checks happens in the browser and in code the database does not change
# (access by role, console errors, failed requests, widths, screenshots): CI's PostgreSQL pass
# skips it (backend_independent); the numbers tests below run on both backends.
@pytest.mark.backend_independent
@pytest.mark.parametrize(("role", "row"), TABLE, ids=[f"{role}-{row.name}" for role, row in TABLE])
def test_every_page_as_every_role(pool, contexts, role: str, row: Row):
    if row.optional and not _route_exists(row.path):
        pytest.skip(f"{row.path} has no route yet (the {row.name} feature is not merged)")
    url = pool.srv.url + row.path.format(step_id=pool.step_id, lease_id=pool.lease_id)
    expected = row.access[role]
    page = contexts[role].new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    failed: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: failed.append(f"{r.url} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and r.url != url and failed.append(f"{r.url} {r.status}"))
    try:
        for width, height in WIDTHS:
            errors.clear()
            failed.clear()
            # given the role's signed-in browser at this width
            page.set_viewport_size({"width": width, "height": height})
            # when the page is opened
            resp = page.goto(url, wait_until="load")
            # then it answers as the roles say
            if expected == "ok":
                assert resp.status == 200, (role, row.path, resp.status)
                assert page.url == url
            elif expected == "403":
                assert resp.status == 403, (role, row.path, resp.status)
                # a clean 403: the site's header and a way on, not a bare "403 Forbidden"
                said = page.locator("[data-forbidden]").text_content()
                assert "Not allowed" in said and f"signed in as {USERS[role]} ({role})" in said, said
                assert page.locator("header nav").get_by_role("link", name="Overview").count() == 1
            else:
                assert resp.status == 200 and re.search(r"/login/\?next=", page.url), (role, page.url)
            if row.name == "api-docs" and expected == "ok":
                page.wait_for_selector(".swagger-ui .information-container .title")
            if (width, height) == WIDTHS[0]:
                # what loads after the load event (fetches, the favicon): the same page at
                # the next width asks for the same (500 ms of quiet a wait: not twice)
                page.wait_for_load_state("networkidle")
            # and the browser logged no error and every resource loaded (the favicon too)
            denied = {"403": ["403 (Forbidden)"], "ok": [], "login": []}[expected]
            assert [e for e in errors if not any(d in e for d in denied)] == [], (role, row.path, width)
            assert failed == [], (role, row.path, width)
            # and at 390 px nothing is wider than the window (tables scroll in their box)
            if width == 390:
                over = page.evaluate("document.scrollingElement.scrollWidth - window.innerWidth")
                assert over <= 1, (role, row.path, over, _widest(page))
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            path = SCREENSHOTS / f"{role}-{row.name}-{width}.png"
            page.screenshot(path=str(path), full_page=True)
            assert path.stat().st_size > 1000
    finally:
        page.close()


def _widest(page) -> list:
    """The elements sticking out of the window, for the failure message."""
    return page.evaluate(
        """() => [...document.querySelectorAll('body *')]
            .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
            .slice(0, 8).map(e => e.tagName + '.' + e.className + ' ' + Math.round(e.getBoundingClientRect().right))"""
    )


def test_the_first_day_reads_right(pool, contexts):
    """Issue 37, part 1, items 1-3 on real pages: token ids read as decoded text, an image sits
    in its message, and the counters agree (the overview, the list, the API; the review header
    and its reviewers' panel)."""
    # given API feedback on one trajectory (feedback given outside the review pages)
    _post(pool.srv, pool.agent_key, "/api/v1/feedback", {"trajectory_uid": "bulk-0", "rating": 1.0})
    page = contexts["reviewer"].new_page()
    page.set_default_timeout(20_000)
    url = pool.srv.url
    try:
        # 1. a white-box step sent with token ids only reads as text, saying what decoded it
        page.goto(f"{url}/trajectories/bulk-1/")
        assert page.locator(".unknown").count() == 0
        decoded = page.locator("pre.decoded").first
        assert decoded.is_visible() and decoded.get_attribute("data-decoded-by")
        assert "decoded from its" in page.locator(".turn").first.inner_text()
        # and the review item a reviewer opens is readable too
        page.goto(f"{url}/review/walk-items/")
        assert page.locator("#review-form").count() == 1
        assert page.locator(".unknown").count() == 0
        # 2. the screenshot is a thumbnail inside its message, after the text, not a JSON tree
        page.goto(f"{url}/trajectories/walk-vision/")
        message = page.locator('.msg[data-role="user"]').first
        thumb = message.locator("figure.msg-image img")
        assert thumb.count() == 1
        thumb.wait_for(state="visible")
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=thumb.element_handle())
        box, inside = message.bounding_box(), thumb.bounding_box()
        assert box["y"] <= inside["y"] and inside["y"] + inside["height"] <= box["y"] + box["height"]
        text = message.inner_text()
        assert text.index("What is on this screen?") < text.index("320×200")
        assert "image_url" not in text and "keys}" not in text
        # 3a. the default queue's header counts what its panel lists (API feedback apart)
        page.goto(f"{url}/review/")
        done, total = map(
            int, re.match(r"(\d+) / (\d+) done", page.locator("[data-progress]").inner_text()).groups()
        )
        panel = [int(c) for c in page.locator(".queue-stats td[data-done]").all_inner_texts()]
        assert done >= 1 and sum(panel) == done, (done, panel)
        assert "Nobody reviewed in this queue yet" not in page.content()
        # 3b. running: the overview, the list's badges, the list filtered, and the API
        page.goto(f"{url}/trajectories/?status=running")
        filtered = page.locator("tr[data-uid]").count()
        page.goto(f"{url}/")
        page.wait_for_load_state("networkidle")
        overview = int(page.locator('[data-live="collect.running"]').inner_text().replace(",", ""))
    finally:
        page.close()
    stats = pool.api("/api/v1/stats")["trajectories_by_status"].get("running", 0)
    listed = len(pool.api("/api/v1/trajectories?status=running&page_size=100")["results"])
    assert overview == filtered == stats == listed, (overview, filtered, stats, listed)


def test_overview_numbers_equal_the_api_with_thousands_separators(pool, contexts):
    # given the API's counts
    stats = pool.api("/api/v1/stats")
    assert stats["steps"] >= 1000
    # when the overview is opened by an operator
    page = contexts["operator"].new_page()
    try:
        page.goto(pool.srv.url + "/")
        page.wait_for_load_state("networkidle")
        raw = page.eval_on_selector_all(
            "[data-live]", "es => Object.fromEntries(es.map(e => [e.dataset.live, e.textContent.trim()]))"
        )
    finally:
        page.close()
    # then its counters are the API's, field by field (its stats and its whole step list)
    shown = {k: int(v.replace(",", "")) for k, v in raw.items() if re.fullmatch(r"[\d,]+", v)}
    steps: list[dict] = []
    url: str | None = "/api/v1/steps?page_size=1000"
    while url:
        page_ = pool.api(url)
        steps += page_["results"]
        url = page_["next"] and page_["next"].removeprefix(pool.srv.url)
    expected = api_counters(stats, steps)
    assert {k: shown[k] for k in expected} == expected
    assert len(steps) == stats["steps"]
    # and big numbers carry thousands separators
    assert raw["collect.steps"] == f"{stats['steps']:,}"
    assert raw["collect.trajectories"] == f"{stats['trajectories']:,}"
