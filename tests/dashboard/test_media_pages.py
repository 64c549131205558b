"""Images on the pages (issue 24, part 5): the step inspector shows a step's images as
thumbnails in order, each opening the full image; thumbnails are small WebPs made once and
kept under thumbs/ (never counted as stored image bytes); both are served to signed-in users
only, with their checked type, nosniff and a Content-Disposition; the overview and the
optimization page show the image counts and the bytes saved by dedup, equal to a direct
computation over the stored rows."""

from __future__ import annotations

import io
import re

import pytest
from django.core.files.storage import default_storage
from django.test import Client
from PIL import Image

from pool.ingest.pipeline import steps_ingest
from pool.media import media_store
from pool.models import Media, Step, StepMedia
from pool.services.trajectories import trajectory_complete
from tests.curation.test_pages import finished, signed_in
from tests.media_support import attach, attach_url, png, sha
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

A, B, C = png(51, (400, 250)), png(52, (90, 60)), png(53, (200, 640))


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


@pytest.fixture
def shots() -> dict[str, list[bytes]]:
    """Two trajectories whose steps re-send images, a remote reference, and an upload that
    no step references yet."""
    uids = [s.uid for s in finished("t1")] + [s.uid for s in finished("t2", seed=4)]
    wanted = {uids[0]: [A], uids[1]: [A, B], uids[2]: [A, B, C], uids[3]: []}
    for uid, images in wanted.items():
        attach(uid, images, first_token=1)
    attach_url(uids[3], "https://images.example/x.png", 0)
    media_store(data=png(54), declared_type="image/png")  # uploaded, not referenced
    return wanted


def stat(html: str, name: str) -> int:
    """A media stat's exact number (data-bytes for the byte sizes, else the text)."""
    match = re.search(rf'data-stat="{name}"(?: data-bytes="(-?\d+)")?>([^<]*)<', html)
    assert match, name
    return int(match.group(1) if match.group(1) is not None else match.group(2))


@pytest.mark.parametrize("url", ["/", "/optimization/"])
def test_overview_and_optimization_show_image_counts_and_bytes_saved_by_dedup(shots, url):
    # given steps referencing 3 distinct images 6 times, a remote image and an unreferenced upload
    # when an operator opens the page
    html = signed_in("operator").get(url).content.decode()
    # then the numbers equal a direct computation over the stored rows and files
    refs = [m for m in StepMedia.objects.all() if m.media_id is not None]
    stored = {m.sha256: len(default_storage.open(m.file.name, "rb").read()) for m in Media.objects.all()}
    referenced = sum(stored[r.media.sha256] for r in refs)
    assert stat(html, "media-images") == len(stored) == 4
    assert stat(html, "media-references") == len(refs) == 6
    assert stat(html, "media-stored-bytes") == sum(stored.values())
    assert stat(html, "media-saved-bytes") == referenced - sum(stored.values())
    # (the same, from what was sent: A 3 times, B twice, C once; stored once each plus the upload)
    assert referenced == 3 * len(A) + 2 * len(B) + len(C)


def test_the_step_page_shows_its_images_in_order_and_each_opens_the_full_image(shots):
    client = signed_in("reviewer")
    step = Step.objects.get(uid=list(shots)[2])
    # when a reviewer opens the step with three images
    html = client.get(f"/steps/{step.id}/").content.decode()
    # then the thumbnails are there in order, each a link to the full image
    pairs = re.findall(
        r'<a href="(/images/[0-9a-f]{64}/)"[^>]*>\s*<img src="(/images/[0-9a-f]{64}/thumb)"', html
    )
    assert pairs == [(f"/images/{sha(b)}/", f"/images/{sha(b)}/thumb") for b in shots[step.uid]]
    # and the full image is the stored bytes with the checked type, inert
    for data in shots[step.uid]:
        resp = client.get(f"/images/{sha(data)}/")
        assert resp.status_code == 200
        assert b"".join(resp.streaming_content) == data
        assert resp["Content-Type"] == "image/png"
        assert resp["X-Content-Type-Options"] == "nosniff"
        assert resp["Content-Disposition"] == f'inline; filename="{sha(data)}.png"'
        assert "sandbox" in resp["Content-Security-Policy"]


def test_a_remote_image_is_shown_as_its_address_and_never_loaded(shots):
    step = Step.objects.get(uid=list(shots)[3])
    html = signed_in("reviewer").get(f"/steps/{step.id}/").content.decode()
    assert "https://images.example/x.png" in html
    assert '<img src="https://images.example' not in html and "/thumb" not in html


def test_thumbnails_are_small_webps_made_once_and_not_counted_as_stored_bytes(shots):
    client = signed_in("reviewer")
    before = sum(Media.objects.values_list("byte_size", flat=True))
    name = f"thumbs/{sha(A)[:2]}/{sha(A)}-320.webp"
    assert not default_storage.exists(name)
    # when the thumbnail of a 400x250 image is requested twice
    first = client.get(f"/images/{sha(A)}/thumb")
    made = default_storage.get_modified_time(name)
    second = client.get(f"/images/{sha(A)}/thumb")
    # then it is a WebP of at most 320 px, served inert, the same bytes both times
    assert first.status_code == second.status_code == 200
    assert first["Content-Type"] == "image/webp" and first["X-Content-Type-Options"] == "nosniff"
    assert first["Content-Disposition"] == f'inline; filename="{sha(A)}-thumb.webp"'
    thumb = Image.open(io.BytesIO(first.content))
    assert thumb.format == "WEBP" and thumb.size == (320, 200)
    assert second.content == first.content
    # and it was stored once, under thumbs/, and is no Media row nor stored image bytes
    assert default_storage.get_modified_time(name) == made
    assert default_storage.open(name, "rb").read() == first.content
    assert Media.objects.count() == 4 and sum(Media.objects.values_list("byte_size", flat=True)) == before
    # and a tall image keeps its aspect ratio (and a small one is never enlarged)
    tall = Image.open(io.BytesIO(client.get(f"/images/{sha(C)}/thumb").content))
    assert tall.size == (100, 320)
    small = Image.open(io.BytesIO(client.get(f"/images/{sha(B)}/thumb").content))
    assert small.size == (90, 60)


@pytest.mark.parametrize("suffix", ["", "thumb"])
def test_images_are_for_signed_in_users_with_a_role_only(shots, suffix):
    url = f"/images/{sha(A)}/{suffix}"
    # anonymous: sent to sign in; signed in without a role: refused; unknown image: 404
    resp = Client().get(url)
    assert resp.status_code == 302 and resp["Location"].startswith("/login/?next=")
    assert signed_in("nobody").get(url).status_code == 403
    assert signed_in("reviewer").get(f"/images/{'0' * 64}/{suffix}").status_code == 404
    assert signed_in("operator").get(f"/images/not-a-hash/{suffix}").status_code == 404


def test_the_trace_view_shows_each_turns_new_screenshots_once_in_order():
    # given a screenshot agent's trajectory: each turn re-sends the whole conversation, one
    # new screenshot per turn (message 2k), referenced from every later step's prompt
    shots = [png(60 + k, (120, 80)) for k in range(3)]
    batch, messages = [], []
    for k in range(3):
        messages = messages + [{"role": "user", "content": f"screen {k}: what now?"}]
        batch.append(
            step_in("ss-trace", k, prompt=[1, 2, k], response=[7, k], reward=1.0, is_last=k == 2,
                    messages=list(messages), response_text=f"click {k}")
        )  # fmt: skip
        messages = messages + [{"role": "assistant", "content": f"click {k}"}]
    steps = sorted(steps_ingest(steps=batch).created, key=lambda s: s.step_index)
    trajectory_complete(uid="ss-trace")
    for k, step in enumerate(steps):
        StepMedia.objects.bulk_create(
            StepMedia(step=step, position=j, media=media_store(data=shots[j], declared_type="image/png"),
                      message_index=2 * j, part_index=1)
            for j in range(k + 1)
        )  # fmt: skip
    # when a reviewer opens the trace view
    client = signed_in("reviewer")
    html = client.get("/trajectories/ss-trace/").content.decode()
    # then each turn shows the screenshot its new message carries, and no earlier one again
    turns = html.split('data-prompt="')[1:]
    assert len(turns) == 3
    shown = [
        re.findall(r'<img src="/images/([0-9a-f]{64})/thumb"', t.split('class="turn response"')[0])
        for t in turns
    ]
    assert shown == [[sha(shots[0])], [sha(shots[1])], [sha(shots[2])]]
    # and the step inspector, which shows the whole prompt, shows all three in order
    page = client.get(f"/steps/{steps[2].id}/").content.decode()
    assert re.findall(r'<img src="/images/([0-9a-f]{64})/thumb"', page) == [sha(s) for s in shots]


def test_an_image_part_shows_as_its_thumbnail_in_place_in_its_message():
    # given a step whose message holds text and an image part (stored, referenced by place)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is on the screen?"},
                {"type": "image_url", "image_url": {"url": "/api/v1/media/x"}},
            ],
        }
    ]
    [step] = steps_ingest(
        steps=[
            step_in(
                "in-place",
                0,
                prompt=[1, 2, 3],
                response=[4],
                is_last=True,
                messages=messages,
                response_text="a cat",
            )
        ]
    ).created
    trajectory_complete(uid="in-place")
    StepMedia.objects.create(
        step=step,
        position=0,
        media=media_store(data=A, declared_type="image/png"),
        message_index=0,
        part_index=1,
    )
    # when a reviewer opens its trajectory
    html = signed_in("reviewer").get("/trajectories/in-place/").content.decode()
    # then the image is a thumbnail inside the message, after its text, not a JSON tree of the part
    message = html.split('data-role="user"')[1].split('class="turn response"')[0]
    assert message.index("what is on the screen?") < message.index(
        f'<figure class="msg-part msg-image" data-sha256="{sha(A)}"'
    )
    assert f'<img src="/images/{sha(A)}/thumb"' in message
    assert "image_url" not in message and "{2 keys}" not in message
    # and it is not shown a second time below the message
    assert html.count(f'src="/images/{sha(A)}/thumb"') == 1
