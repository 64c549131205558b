"""Images by possession (pool.selectors.media, pool.media, pool.models.MediaSource):
a source references an image by sha256, and reads it back, only when it holds it (uploaded
the bytes, or a step of it carried them). Everywhere else an image another source holds
answers exactly as an unknown hash does, and an upload answers 201 whether or not the bytes
were stored already."""

from __future__ import annotations

import hashlib

import pytest

from pool.models import Media, MediaSource, Scope, Source
from tests.conftest import client_for, make_step
from tests.media_support import png

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload(c, data: bytes):
    return c.post("/api/v1/media", data=data, content_type="image/png")


def reference(c, digest: str, uid: str):
    step = make_step(uid, 0, group=f"g-{uid}", multi_modal_data={"images": [{"sha256": digest}]})
    return c.post("/api/v1/steps", {"steps": [step]}, format="json")


def read(c, digest: str):
    return c.get(f"/api/v1/media/{digest}")


def test_other_sources_images_answer_as_unknown_hashes_until_the_bytes_are_sent(make_key):
    # given: sources a and b (ingest keys) and an image X
    a = client_for(make_key(Scope.INGEST, name="src-a"))
    b = client_for(make_key(Scope.INGEST, name="src-b"))
    x = png(1)
    render_x = {
        "sha256": sha(x), "media_type": "image/png", "width": 64, "height": 40,
        "byte_size": len(x), "url": f"/api/v1/media/{sha(x)}",
    }  # fmt: skip
    # when / then: each action in order, its status and body
    steps = [
        # (who, action, image, status, body: a JSON dict, the bytes, or None: compared below)
        ("a", "upload", x, 201, render_x),
        ("a", "read", x, 200, x),  # the uploader holds it
        ("b", "read", x, 404, None),
        ("b", "reference", x, 400, None),
        ("a", "reference", x, 201, None),
        ("b", "read", x, 404, None),  # a's step references it: still not b's
        ("b", "upload", x, 201, render_x),  # same answer as a fresh upload: no oracle
        ("b", "read", x, 200, x),
        ("b", "reference", x, 201, None),
        ("a", "upload", x, 201, render_x),  # again: same answer, stored once
    ]
    clients = {"a": a, "b": b}
    n = 0
    for who, action, data, status, want in steps:
        n += 1
        c = clients[who]
        if action == "upload":
            resp = upload(c, data)
        elif action == "read":
            resp = read(c, sha(data))
        else:
            resp = reference(c, sha(data), f"{who}{n}")
        assert resp.status_code == status, (who, action, resp.content)
        if isinstance(want, dict):
            assert resp.json() == want
        elif isinstance(want, bytes):
            assert b"".join(resp.streaming_content) == want
    # and: the bytes are stored once; both sources hold them
    assert Media.objects.count() == 1
    held = set(MediaSource.objects.values_list("source__name", flat=True))
    assert held == {Source.objects.get(name="src-a").name, Source.objects.get(name="src-b").name}


def test_each_door_answers_an_other_sources_hash_exactly_as_an_unknown_one(make_key):
    # given: an image only source a holds (uploaded, and referenced by a's step)
    a = client_for(make_key(Scope.INGEST, name="src-a"))
    b = client_for(make_key(Scope.INGEST, name="src-b"))
    x, unknown = png(3), sha(png(4))
    assert upload(a, x).status_code == 201
    assert reference(a, sha(x), "a-own").status_code == 201
    before = (Media.objects.count(), MediaSource.objects.count())
    doors = [
        ("read", lambda digest, uid: read(b, digest)),
        ("reference", lambda digest, uid: reference(b, digest, uid)),
    ]
    for door, call in doors:
        # when: b tries a's hash, then an unknown one
        other = call(sha(x), f"{door}-other")
        missing = call(unknown, f"{door}-missing")
        # then: the same status and the same body (up to the hash itself and the uid)
        assert other.status_code == missing.status_code and other.status_code in (400, 404), door
        assert other["Content-Type"] == missing["Content-Type"], door
        norm = [
            r.content.decode()
            .replace(d, "<sha>")
            .replace(f"{door}-other", "<uid>")
            .replace(f"{door}-missing", "<uid>")
            for r, d in ((other, sha(x)), (missing, unknown))
        ]
        assert norm[0] == norm[1], door
        if door == "reference":
            err = other.json()["error"]
            assert err["param"] == "steps[0].multi_modal_data.images[0].sha256"
            assert "no stored image" in err["message"]
    # and: nothing was written by the refused references
    assert (Media.objects.count(), MediaSource.objects.count()) == before
    assert read(b, sha(x)).status_code == 404


def test_unrestricted_readers_and_new_bytes(make_key, reader_key):
    # given: a's image; a read key (unrestricted) and b's fresh upload
    a = client_for(make_key(Scope.INGEST, name="src-a"))
    b = client_for(make_key(Scope.INGEST, name="src-b"))
    x, y = png(5), png(6)
    assert upload(a, x).status_code == 201
    # when / then: new bytes answer 201 as existing ones do; a read key reads any image
    assert upload(b, y).status_code == 201
    assert read(client_for(reader_key), sha(x)).status_code == 200
    assert read(client_for(reader_key), sha(y)).status_code == 200
    assert read(a, sha(y)).status_code == 404
