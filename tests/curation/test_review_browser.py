"""The review loop in a real browser: a reviewer made with `manage.py create_user` signs in on
/login/, reviews the next item of the default queue, and finds the feedback on the
trajectory page. Playwright drives the system Chromium against a live server process."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.curation.test_pages_browser import CHROMIUM, browser_page  # noqa: F401 - fixture
from tests.live import LiveServer, live_server

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

PASSWORD = "reviewer-browser-pw-1"

# One completed trajectory with text: the default queue's only item.
SETUP = """
from pool.ingest.pipeline import steps_ingest
from pool.services.trajectories import trajectory_complete
from tests.pool.factories import step_in
steps_ingest(steps=[
    step_in("rb-t", 0, prompt=[1, 2, 3], response=[4, 5], reward=1.0, is_last=True,
            messages=[{"role": "user", "content": "What is 2 + 2?"}], response_text="It is 4."),
])
trajectory_complete(uid="rb-t")
"""


@pytest.fixture
def server(tmp_path) -> Iterator[LiveServer]:
    var_dir = tmp_path / "srv"
    var_dir.mkdir()
    with live_server(var_dir) as srv:
        srv.env["CLAW_USER_PASSWORD"] = PASSWORD
        srv.manage("create_user", "--username", "r", "--role", "reviewer", "--noinput")
        srv.manage("shell", "-c", SETUP)
        yield srv


def test_a_reviewer_signs_in_reviews_and_sees_the_feedback(server, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    page, _ = browser_page
    # given the reviewer opens /review/ and is sent to the sign-in page
    page.goto(f"{server.url}/review/")
    page.wait_for_url("**/login/?next=/review/")
    # when they sign in there
    page.fill("#id_username", "r")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    # then the default queue's item is open, as text
    page.wait_for_url(f"{server.url}/review/")
    expect(page.locator(".timeline")).to_contain_text("What is 2 + 2?")
    expect(page.locator(".timeline")).to_contain_text("It is 4.")
    expect(page.locator("[data-progress]")).to_contain_text("0 / 1 done")

    # when they rate, label and comment it, and submit
    page.click("label[for=star-5]")  # the rating is stars now (1 to 5)
    expect(page.locator("#rating-value")).to_have_text("5 / 5")
    page.fill("#id_label", "correct")
    page.fill("#id_comment", "Right answer, well put.")
    page.get_by_role("button", name="Submit").click()
    # then the queue is done and says so
    expect(page.locator(".messages")).to_contain_text("Feedback recorded")
    expect(page.locator(".card.empty")).to_contain_text("Nothing to review right now")
    expect(page.locator("[data-progress]")).to_contain_text("1 / 1 done")

    # when they open the trajectory page
    page.goto(f"{server.url}/trajectories/rb-t/")
    # then their feedback is there, with them as author
    feedback = page.locator(".feedback").first
    expect(feedback).to_contain_text("rating 5.0")
    expect(feedback).to_contain_text("correct")
    expect(feedback).to_contain_text("Right answer, well put.")
    expect(feedback).to_contain_text("by r")
    # and a reviewer is not offered curation
    expect(page.locator("header nav")).not_to_contain_text("Curation")
    expect(page.locator("#label-form")).to_have_count(0)


# --- the workbench: keyboard-only review, group ranking, screenshots ---------------------------
SCREENSHOTS = Path(__file__).resolve().parents[2] / "var" / "screenshots"
RATINGS = [5, 3, 1, 4, 2, 5, 4, 3, 2, 1]  # pressed for the ten items, in order
WORKBENCH = """
from pool.ingest.pipeline import steps_ingest
from pool.services.trajectories import trajectory_complete
from pool.services.groups import group_upsert
from curation.services.review import review_queue_create
from tests.pool.factories import step_in
for i in range(10):
    steps_ingest(steps=[step_in(f"kb-{i}", 0, prompt=[1, 2, i], response=[4, 5], is_last=True,
        messages=[{"role": "user", "content": f"Question {i}: what is {i} + {i}?"}],
        response_text=f"It is {2 * i}.")])
    trajectory_complete(uid=f"kb-{i}", channel="val")
review_queue_create(name="kb", filters={"readiness": "any", "channel": "val"},
    label_choices=["correct", "wrong", "unclear"], description="Ten arithmetic answers.",
    guidelines="## How to rate\\n- **5**: right and clear\\n- **1**: wrong\\n\\nSee [the rubric](https://example.com/rubric). <script>alert(1)</script>")
group_upsert(uid="grp-1", expected_rollouts=3)
answers = ["The capital of Australia is Sydney.", "Canberra is the capital of Australia.",
           "Australia's capital: Canberra (since 1913), not Sydney or Melbourne."]
for i, text in enumerate(answers):
    steps_ingest(steps=[step_in(f"grp-1-r{i}", 0, prompt=[1, 2], response=[3, i], group="grp-1", is_last=True,
        messages=[{"role": "user", "content": "What is the capital of Australia?"}], response_text=text)])
    trajectory_complete(uid=f"grp-1-r{i}")
review_queue_create(name="slide", filters={"readiness": "any", "channel": "val"}, rating_min=0, rating_max=100,
    label_choices=["correct", "wrong", "slow", "verbose"], label_multi=True)
review_queue_create(name="rank", filters={"readiness": "any", "channel": "train"}, mode="group",
    group_reward="rank", guidelines="Rank **correct and complete** answers first.")
"""


@pytest.fixture
def bench(tmp_path) -> Iterator[LiveServer]:
    var_dir = tmp_path / "srv"
    var_dir.mkdir()
    with live_server(var_dir) as srv:
        srv.env["CLAW_USER_PASSWORD"] = PASSWORD
        srv.manage("create_user", "--username", "r", "--role", "reviewer", "--noinput")
        srv.manage("shell", "-c", WORKBENCH)
        yield srv


def sign_in(page, server: LiveServer, path: str) -> None:
    page.goto(f"{server.url}/login/?next={path}")
    page.fill("#id_username", "r")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{server.url}{path}")


def db_rows(server: LiveServer, code: str) -> object:
    """A value the server's database gives (``code`` sets ``out``), as JSON."""
    return json.loads(
        server.manage("shell", "-c", f"import json\n{code}\nprint(json.dumps(out))").strip().splitlines()[-1]
    )


def test_ten_items_reviewed_with_the_keyboard_only(bench, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    page, _ = browser_page
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, bench, "/review/kb/")
    expect(page.locator(".guidelines")).to_contain_text("How to rate")
    expect(page.locator(".guidelines")).to_contain_text("<script>alert(1)</script>")  # shown as text
    expect(page.locator(".hotkeys-card")).to_contain_text("show or hide this help")
    # given the help overlay opens and closes with ?
    page.keyboard.press("?")
    expect(page.locator("#hotkeys-help")).to_be_visible()
    page.keyboard.press("?")
    expect(page.locator("#hotkeys-help")).to_be_hidden()
    page.keyboard.press("4")
    expect(page.locator("#rating-value")).to_have_text("4 / 5")
    page.screenshot(path=str(SCREENSHOTS / "review-1440.png"), full_page=True)
    # j moves on to the next item, k back to the one left
    first = page.locator(".item h2 code").inner_text()
    page.keyboard.press("j")
    expect(page.locator(".item h2 code")).not_to_have_text(first)
    page.keyboard.press("k")
    expect(page.locator(".item h2 code")).to_have_text(first)
    # when the reviewer rates each item with a digit and submits with Enter, no clicks
    seen = []
    for i, rating in enumerate(RATINGS):
        uid = page.locator(".item h2 code").inner_text()
        seen.append(uid)
        page.keyboard.press(str(rating))
        page.keyboard.press("Enter")
        expect(page.locator("[data-progress]")).to_contain_text(f"{i + 1} / 10 done")
    expect(page.locator(".card.empty")).to_contain_text("Nothing to review right now")
    # then the database holds ten feedback rows by r with the ratings pressed, item by item
    rows = db_rows(
        bench,
        "from pool.models import Feedback\n"
        "out = {f.trajectory.uid: [f.rating, f.author] for f in Feedback.objects.select_related('trajectory')}",
    )
    assert rows == {uid: [float(r), "r"] for uid, r in zip(seen, RATINGS, strict=True)}
    assert sorted(seen) == sorted(f"kb-{i}" for i in range(10))
    expect(page.locator("[data-reviewer=r] [data-done]")).to_have_text("10")


def test_a_group_ranked_in_group_mode_sets_the_rewards(bench, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    page, _ = browser_page
    page.set_viewport_size({"width": 1440, "height": 900})
    sign_in(page, bench, "/review/rank/")
    expect(page.locator(".rollout")).to_have_count(3)
    expect(page.locator(".rollout").nth(1)).to_contain_text("Canberra is the capital")
    # when the reviewer presses the rollouts best first: 3, 2, 1
    for key in ("3", "2", "1"):
        page.keyboard.press(key)
    expect(page.locator(".rollout").nth(2).locator("[data-rank-badge]")).to_have_text("rank 1 of 3")
    expect(page.locator("#ranking-now")).to_contain_text("All 3 ranked")
    page.screenshot(path=str(SCREENSHOTS / "review-group-1440.png"), full_page=True)
    page.keyboard.press("Enter")
    expect(page.locator(".messages")).to_contain_text("Feedback recorded")
    # then rank r of 3 is the human reward (3 - r) / 2: rollout 3 best, rollout 1 last
    rewards = db_rows(
        bench,
        "from pool.models import Trajectory\n"
        "out = {t.uid: [t.reward, t.reward_source] for t in Trajectory.objects.filter(group__uid='grp-1')}",
    )
    assert rewards == {"grp-1-r0": [0.0, "human"], "grp-1-r1": [0.5, "human"], "grp-1-r2": [1.0, "human"]}


def test_the_workbench_at_390_px(bench, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    page, _ = browser_page
    page.set_viewport_size({"width": 390, "height": 844})
    sign_in(page, bench, "/review/kb/")
    page.keyboard.press("3")
    expect(page.locator("#rating-value")).to_have_text("3 / 5")
    # nothing wider than the screen
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(SCREENSHOTS / "review-390.png"), full_page=True)
    # a wide range is a slider with its number box; 5 is its top, labels are chips
    page.goto(f"{bench.url}/review/slide/")
    page.keyboard.press("5")
    expect(page.locator("#id_rating")).to_have_value("100")
    page.keyboard.press("2")
    expect(page.locator("#id_rating")).to_have_value("25")
    expect(page.locator(".chips .chip")).to_have_count(4)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    page.screenshot(path=str(SCREENSHOTS / "review-slider-390.png"), full_page=True)


def test_an_operator_makes_a_queue_with_the_builder_and_guidelines(bench, browser_page):  # noqa: F811
    from playwright.sync_api import expect

    page, _ = browser_page
    bench.manage("create_user", "--username", "op", "--role", "operator", "--noinput")
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{bench.url}/login/?next=/review/queues/")
    page.fill("#id_username", "op")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{bench.url}/review/queues/")
    # given the builder's fields, as on /curation/, and its live preview
    page.fill("#id_name", "val-check")
    page.fill("#id_guidelines", "Check **every** step.")
    page.select_option("#id_channel", "val")
    page.select_option("#id_readiness", "any")
    expect(page.locator("[data-preview=trajectories]")).to_have_text("10")
    page.screenshot(path=str(SCREENSHOTS / "review-queues-1440.png"), full_page=True)
    page.get_by_role("button", name="Create queue").click()
    # then the queue serves the val trajectories with its guidelines beside the item
    page.wait_for_url(f"{bench.url}/review/val-check/")
    expect(page.locator(".guidelines strong")).to_have_text("every")
    expect(page.locator("[data-progress]")).to_contain_text("0 / 10 done")
