"""Images in a real browser (issue 24, part 5): Playwright against a live server. A stored
image shows as a thumbnail on the step page and opens full size on click, both served with
their checked raster type, nosniff and a Content-Disposition; hostile uploads (an SVG with
script, HTML declared as a PNG) are refused at the door, so no page can ever serve them, and
nothing runs. Screenshots of the step page at 1440 and 390 px go to var/screenshots/."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator

import httpx
import pytest

from tests.curation.test_pages_browser import CHROMIUM
from tests.dashboard.test_dashboard_browser import browser, first_page, shot, sign_in  # noqa: F401
from tests.live import LiveServer, live_server
from tests.media_support import png

pytestmark = [
    pytest.mark.browser,
    pytest.mark.live,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is not installed"),
]

SETUP = """
from django.contrib.auth import get_user_model
from pool.services.api_keys import api_key_create
get_user_model().objects.create_superuser("op", "op@example.com", "browser-pw-1")
print(api_key_create(name="media-agent", scopes=["ingest"])[1])
"""
IMAGE = png(61, (480, 300))
SVG = b'<svg xmlns="http://www.w3.org/2000/svg" onload="window.__xss=1;alert(1)"><script>alert(2)</script></svg>'
HTML = b"<!doctype html><html><body><script>window.__xss=3;alert(3)</script></body></html>"
# (what an attacker uploads, the type it declares): every one is refused, naming the body
HOSTILE = [
    (SVG, "image/svg+xml"),
    (SVG, "image/png"),
    (HTML, "image/png"),
    (HTML, "application/octet-stream"),
]


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[LiveServer, str]]:
    with live_server(tmp_path / "srv") as srv:
        key = srv.manage("shell", "-c", SETUP).strip().splitlines()[-1]
        yield srv, key


def test_images_are_shown_inert_and_hostile_uploads_are_refused(server, browser):  # noqa: F811
    from playwright.sync_api import expect

    srv, key = server
    auth = {"Authorization": f"Bearer {key}"}
    # given an uploaded PNG and a step that references it
    up = httpx.post(f"{srv.url}/api/v1/media", content=IMAGE, headers={**auth, "Content-Type": "image/png"})
    assert up.status_code == 201, up.text
    sha = up.json()["sha256"]
    assert sha == hashlib.sha256(IMAGE).hexdigest()
    step = {
        "trajectory_uid": "shots",
        "step_index": 0,
        "prompt_ids": [1, 2, 3],
        "response_ids": [4, 5],
        "multi_modal_data": {"images": [{"sha256": sha}]},
    }
    assert httpx.post(f"{srv.url}/api/v1/steps", json={"steps": [step]}, headers=auth).status_code < 300
    # and hostile uploads, each refused with a 4xx naming the body, as a file and inside a step
    for data, declared in HOSTILE:
        resp = httpx.post(f"{srv.url}/api/v1/media", content=data, headers={**auth, "Content-Type": declared})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "body", (declared, resp.text)
        bad = {
            **step,
            "trajectory_uid": "bad",
            "multi_modal_data": {"images": [base64.b64encode(data).decode()]},
        }
        resp = httpx.post(f"{srv.url}/api/v1/steps", json={"steps": [bad]}, headers=auth)
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["param"] == "steps[0].multi_modal_data.images[0]"
    context, dialogs = browser
    page = first_page(context)
    sign_in(page, srv.url)
    # when the operator opens the step page, the thumbnail loads
    thumbs: list = []
    page.on("response", lambda r: thumbs.append(r) if r.url.endswith(f"/images/{sha}/thumb") else None)
    page.goto(f"{srv.url}/steps/")
    page.get_by_role("link", name="shots:0").click()
    img = page.locator(f'.media-thumb[data-sha256="{sha}"] img')
    expect(img).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=img.element_handle())
    assert img.evaluate("i => [i.naturalWidth, i.naturalHeight]") == [320, 200]
    # then the thumbnail was served as a WebP, nosniff, with a filename
    assert len(thumbs) == 1
    headers = thumbs[0].all_headers()
    assert headers["content-type"] == "image/webp" and headers["x-content-type-options"] == "nosniff"
    assert headers["content-disposition"] == f'inline; filename="{sha}-thumb.webp"'
    for width, name in ((1440, "media-step-1440"), (390, "media-step-390")):
        page.set_viewport_size({"width": width, "height": 900})
        shot(page, name)
        box = img.bounding_box()
        assert box and 0 < box["x"] and box["x"] + box["width"] <= width, (width, box)
    # when the thumbnail is clicked, the full image opens as stored, with its checked type
    fulls: list = []
    context.on("response", lambda r: fulls.append(r) if r.url == f"{srv.url}/images/{sha}/" else None)
    with context.expect_page() as opened:
        img.click()
    full_page = opened.value
    full_page.wait_for_load_state()
    assert full_page.url == f"{srv.url}/images/{sha}/" and len(fulls) == 1
    resp = fulls[0]
    assert resp.body() == IMAGE
    headers = resp.all_headers()
    assert headers["content-type"] == "image/png" and headers["x-content-type-options"] == "nosniff"
    assert headers["content-disposition"] == f'inline; filename="{sha}.png"'
    assert "sandbox" in headers["content-security-policy"]
    # and the refused SVG and HTML were never stored: their page URLs are 404s, and nothing ran
    for data, _ in HOSTILE:
        gone = page.goto(f"{srv.url}/images/{hashlib.sha256(data).hexdigest()}/")
        assert gone is not None and gone.status == 404
    assert page.evaluate("() => window.__xss") is None and full_page.evaluate("() => window.__xss") is None
    assert dialogs == []
