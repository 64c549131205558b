"""The review loop in a real browser: a reviewer made with `manage.py create_user` signs in on
/login/, reviews the next item of the default queue, and finds the feedback on the
trajectory page. Playwright drives the system Chromium against a live server process."""

from __future__ import annotations

import os
from collections.abc import Iterator

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
from pool.services import steps_ingest, trajectory_complete
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
    page.fill("#id_rating", "5")
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
