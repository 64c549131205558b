"""Images stored once by content (pool/media.py, pool/ingest/media.py): dedup, the
hostile cases refused whole with their field named, placeholder spans, uploads and downloads,
and the images each batch format carries."""

from __future__ import annotations

import base64
import hashlib
import io
import struct
import zlib

import msgspec
import pytest
from PIL import Image
from rest_framework.test import APIClient

from curation.formats import padded, steps
from pool.media import media_store
from pool.models import Media, Scope, Step, StepMedia
from pool.selectors.steps import steps_listed, steps_render
from tests.conftest import make_step

pytestmark = pytest.mark.django_db

PAD = 151655


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    settings.CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS = [PAD]
    return settings.MEDIA_ROOT


def png(seed: int = 0, size: tuple[int, int] = (32, 20), fmt: str = "PNG") -> bytes:
    image = Image.new("RGB", size, (seed % 256, (seed * 7) % 256, 90))
    image.putpixel((seed % size[0], 0), (255, 255, 255))
    out = io.BytesIO()
    image.save(out, fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A small PNG whose header declares ``width`` x ``height`` pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\0" * 64))
        + chunk(b"IEND", b"")
    )


SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


def client(key: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return c


def counts() -> tuple[int, int, int]:
    return Step.objects.count(), Media.objects.count(), StepMedia.objects.count()


def image_step(traj: str, index: int, images: list, *, n_pad: int | None = None) -> dict:
    """A white-box step with ``multi_modal_data``; its prompt shows one run of ``n_pad``
    placeholder ids per image when given."""
    prompt = [5, 6]
    for _ in images if n_pad else ():
        prompt += [7] + [PAD] * n_pad + [8]
    return make_step(traj, index, prompt=prompt, response=[9, 10], multi_modal_data={"images": images})


# --- the service --------------------------------------------------------------------------------
def test_the_same_bytes_are_stored_once_with_their_checked_type_and_size(media_root):
    # given: one PNG and one JPEG
    a, j = png(1, (40, 30)), png(2, (16, 8), "JPEG")
    # when: the PNG is stored twice (declared, then not) and the JPEG once
    first = media_store(data=a, declared_type="image/png")
    again = media_store(data=a, declared_type=None)
    jpeg = media_store(data=j, declared_type="image/jpg")
    # then: one row and one file per distinct image, exact bytes under media/<sha[:2]>/<sha>
    assert first.pk == again.pk and Media.objects.count() == 2
    sha = hashlib.sha256(a).hexdigest()
    assert (first.sha256, first.media_type, first.width, first.height, first.byte_size) == (
        sha, "image/png", 40, 30, len(a)
    )  # fmt: skip
    assert first.file.name == f"media/{sha[:2]}/{sha}"
    assert (media_root / first.file.name).read_bytes() == a
    assert (jpeg.media_type, jpeg.width, jpeg.height) == ("image/jpeg", 16, 8)
    assert sorted(p.name for p in (media_root / "media").rglob("*") if p.is_file()) == sorted(
        [sha, hashlib.sha256(j).hexdigest()]
    )


# --- hostile input: refused whole, the field named, nothing written ------------------------------
HOSTILE = [
    # (case, the bad step's images, settings, status, field, words in the message)
    ("not an image", [b64(b"hello, this is text")], {}, 400, "images[0]", "not a PNG"),
    ("wrong declared type", [data_url(png(3), "image/jpeg")], {}, 400, "images[0]", "not the declared"),
    ("truncated PNG", [b64(png(4)[:60])], {}, 400, "images[0]", "decode"),
    ("decompression bomb", [b64(bomb_png())], {}, 400, "images[0]", "pixels"),
    ("over max bytes", [b64(png(5, (64, 64)))], {"CLAW_MEDIA_MAX_BYTES": 100}, 413, "images[0]", "over the limit"),
    ("SVG with script (declared)", [data_url(SVG, "image/svg+xml")], {}, 400, "images[0]", "SVG"),
    ("SVG with script (undeclared)", [b64(SVG)], {}, 400, "images[0]", "SVG"),
    ("unknown sha256", [{"sha256": "0" * 64}], {}, 400, "images[0].sha256", "upload it first"),
    ("malformed sha256", [{"sha256": "xyz"}], {}, 400, "images[0].sha256", "hex"),
    ("not base64", ["@@@not base64@@@"], {}, 400, "images[0]", "base64"),
    ("too many images", [b64(png(6))] * 3, {"CLAW_MEDIA_MAX_PER_STEP": 2}, 400, "images", "at most 2"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "images", "limits", "status", "field", "words"), HOSTILE, ids=[r[0] for r in HOSTILE]
)
def test_a_step_with_a_bad_image_is_refused_whole(
    settings, agent, case, images, limits, status, field, words
):
    # given: a batch whose first step carries a good image and whose second step a bad one
    for name, value in limits.items():
        setattr(settings, name, value)
    good = image_step("h", 0, [b64(png(99, (4, 4)))])
    bad = image_step("h", 1, images)
    before = counts()
    # when: it is submitted
    resp = agent.post("/api/v1/steps", {"steps": [good, bad]}, format="json")
    # then: the API error names the bad image's field, and nothing of the batch is stored
    assert resp.status_code == status, resp.content
    err = resp.json()["error"]
    assert err["param"] == f"steps[1].multi_modal_data.{field}", err
    assert words in err["message"], err
    assert counts() == before == (0, 0, 0)


def test_videos_and_unknown_keys_are_refused_with_their_field(agent):
    for mmd, field in (({"videos": ["AAAA"]}, "videos"), ({"audio": []}, "audio")):
        step = make_step("v", 0, prompt=[1], response=[2], multi_modal_data=mmd)
        resp = agent.post("/api/v1/steps", {"steps": [step]}, format="json")
        assert (
            resp.status_code == 400 and resp.json()["error"]["param"] == f"steps[0].multi_modal_data.{field}"
        )
    assert counts() == (0, 0, 0)


# --- white-box steps: JSON and MessagePack, uploads, spans, reads ---------------------------------
def test_white_box_images_are_stored_once_with_spans_and_read_back_in_order(agent, reader_key):
    # given: an image uploaded first, and two more sent inline (base64, data URL, msgpack bytes)
    up, inline, shared = png(10), png(11), png(12)
    resp = agent.post("/api/v1/media", data=up, content_type="image/png")
    assert resp.status_code == 201, resp.content
    assert resp.json() == {
        "sha256": hashlib.sha256(up).hexdigest(), "media_type": "image/png", "width": 32, "height": 20,
        "byte_size": len(up), "url": f"/api/v1/media/{hashlib.sha256(up).hexdigest()}",
    }  # fmt: skip
    again = agent.post("/api/v1/media", data=up, content_type="image/png")  # idempotent: same answer
    assert (again.status_code, again.json()) == (201, resp.json())
    s0 = image_step("w", 0, [{"sha256": hashlib.sha256(up).hexdigest()}, b64(shared)], n_pad=4)
    s1 = image_step("w", 1, [data_url(shared), data_url(inline)], n_pad=3)
    packed = msgspec.msgpack.encode({"steps": [image_step("w", 2, [shared, inline])]})
    # when: they are submitted as JSON and as MessagePack
    assert agent.post("/api/v1/steps", {"steps": [s0, s1]}, format="json").status_code == 201
    resp = agent.generic("POST", "/api/v1/steps", packed, content_type="application/msgpack")
    assert resp.status_code == 201, resp.content
    # then: three distinct images, five references, in order, with the placeholder spans
    assert Media.objects.count() == 3 and StepMedia.objects.count() == 6
    got = {s["uid"]: s for s in agent.get("/api/v1/steps?trajectory_uid=w").json()["results"]}
    want = {
        "w-s0": [(up, (3, 7)), (shared, (9, 13))],
        "w-s1": [(shared, (3, 6)), (inline, (8, 11))],
        "w-s2": [(shared, None), (inline, None)],  # no placeholder runs in its prompt: no spans
    }
    for uid, images in want.items():
        refs = got[uid]["images"]
        assert got[uid]["multi_modal_data"] == {"images": refs}
        assert [r["sha256"] for r in refs] == [hashlib.sha256(d).hexdigest() for d, _ in images]
        assert [
            (r["token_start"], r["token_end"]) if r["token_start"] is not None else None for r in refs
        ] == [span for _, span in images]
        for r, (data, _) in zip(refs, images, strict=True):
            assert (r["media_type"], r["width"], r["height"], r["kind"]) == ("image/png", 32, 20, "stored")
            # and: each downloads byte-exact, with its checked type and headers
            dl = client(reader_key).get(r["url"])
            assert dl.status_code == 200 and b"".join(dl.streaming_content) == data
            assert dl["Content-Type"] == "image/png" and dl["X-Content-Type-Options"] == "nosniff"
            assert dl["Content-Disposition"] == f'inline; filename="{r["sha256"]}.png"'
            assert dl["Cache-Control"] == "private, max-age=31536000, immutable"
            assert dl["ETag"] == f'"{r["sha256"]}"'
            assert client(reader_key).get(r["url"], HTTP_IF_NONE_MATCH=dl["ETag"]).status_code == 304
    # and: a resubmission is a duplicate, a changed image a conflict
    again = agent.post("/api/v1/steps", {"steps": [s0]}, format="json")
    assert again.status_code == 200 and again.json()["duplicates"] == 1
    changed = image_step("w", 0, [b64(inline), b64(shared)], n_pad=4)
    assert agent.post("/api/v1/steps", {"steps": [changed]}, format="json").status_code == 409


def test_uploads_refuse_what_steps_refuse_and_downloads_need_a_key_that_may_see_it(make_key, agent):
    # given: an upload that is SVG, one that is not an image, and a good one
    for body, content_type, field in ((SVG, "image/svg+xml", "body"), (b"text", "image/png", "body")):
        resp = agent.post("/api/v1/media", data=body, content_type=content_type)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == field, resp.content
    multipart = agent.post("/api/v1/media", {"file": io.BytesIO(png(20))}, format="multipart")
    assert multipart.status_code == 201, multipart.content
    assert Media.objects.count() == 1
    url = multipart.json()["url"]
    # then: a consume key reads it; no key is 401; the uploader's source reads it; an ingest
    # key of another source gets 404, and may not reference it by hash (400, as for an unknown
    # hash: tests/pool/test_media_possession.py); once it sends the bytes in a step, 200
    assert client(make_key(Scope.CONSUME, name="t")).get(url).status_code == 200
    assert APIClient().get(url).status_code == 401
    assert client(agent_key_of(agent)).get(url).status_code == 200  # the uploader holds it
    other = make_key(Scope.INGEST, name="other-agent")
    assert client(other).get(url).status_code == 404
    step = image_step("o", 0, [{"sha256": multipart.json()["sha256"]}])
    assert client(other).post("/api/v1/steps", {"steps": [step]}, format="json").status_code == 400
    assert client(other).get(url).status_code == 404
    step = image_step("o", 0, [b64(png(20))])
    assert client(other).post("/api/v1/steps", {"steps": [step]}, format="json").status_code == 201
    assert client(other).get(url).status_code == 200


def agent_key_of(c: APIClient) -> str:
    return c._credentials["HTTP_AUTHORIZATION"].split()[1]


# --- batch formats ------------------------------------------------------------------------------
def test_steps_and_padded_carry_each_rows_images_with_one_query_for_the_batch(
    agent, django_assert_num_queries
):
    # given: 6 steps, some with images
    images = [png(30 + i) for i in range(3)]
    batch = [image_step("f", i, [b64(images[i % 3])] * (i % 3)) for i in range(6)]
    assert agent.post("/api/v1/steps", {"steps": batch}, format="json").status_code == 201
    rows_qs = list(steps_listed().order_by("step_index"))
    # when: rendered (token chains: one query; images: one query)
    with django_assert_num_queries(2):
        rows = steps_render(rows_qs)
    for r in rows:
        r["mask"], r["staleness"] = False, None
    # then: each format's rows hold the step's images in order
    want = [[hashlib.sha256(images[i % 3]).hexdigest()] * (i % 3) for i in range(6)]
    assert [[im["sha256"] for im in r["images"]] for r in steps(rows)["steps"]] == want
    assert [[im["sha256"] for im in row] for row in padded(rows)["images"]] == want
    first = padded(rows)["images"][1][0]
    assert set(first) >= {"sha256", "media_type", "width", "height", "url"}
    assert first["url"] == f"/api/v1/media/{want[1][0]}"


def test_an_image_sent_again_after_a_refused_write_is_checked_and_stored_then(agent, media_root):
    # given: a batch refused whole (its second step's image is bad) after its first image's
    # base64 text was decoded once (the pipeline remembers the texts it decoded)
    good = png(40)
    refused = [image_step("again", 0, [b64(good)]), image_step("again", 1, [b64(b"not an image")])]
    assert agent.post("/api/v1/steps", {"steps": refused}, format="json").status_code == 400
    assert counts() == (0, 0, 0)
    # when: the same text is sent again, declared wrongly, then rightly
    wrong = image_step("again", 0, [data_url(good, "image/gif")])
    resp = agent.post("/api/v1/steps", {"steps": [wrong]}, format="json")
    assert resp.status_code == 400 and "not the declared image/gif" in resp.json()["error"]["message"]
    assert (
        agent.post(
            "/api/v1/steps", {"steps": [image_step("again", 0, [b64(good)])]}, format="json"
        ).status_code
        == 201
    )
    # then: it was decoded, checked and stored, byte-exact, once
    (media,) = Media.objects.all()
    assert (
        media.sha256 == hashlib.sha256(good).hexdigest()
        and (media_root / media.file.name).read_bytes() == good
    )
    # and: a later step re-sending it references the same image
    assert (
        agent.post(
            "/api/v1/steps", {"steps": [image_step("again", 1, [b64(good)])]}, format="json"
        ).status_code
        == 201
    )
    assert Media.objects.count() == 1 and StepMedia.objects.filter(media=media).count() == 2
