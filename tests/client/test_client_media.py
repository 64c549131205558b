"""ClawClient's images (issue 24, part 4) against a real server process (tests/live.py): a
trainer gets a pulled row's images back byte-exact (bytes, or PIL images), each image is
downloaded once (the disk cache by sha256), and bytes that do not hash to their name are
caught, whether served so or corrupted in the cache.

docs/trainers.md, Images for trainers: Each format carries a step's images in order (images, see
Images), by reference: a trainer downloads each image once by its sha256.
ClawClient.fetch_media(sha256) returns an image's bytes, checked against their sha256, and
caches them on disk by hash (~/.cache/claw_client/media, CLAW_CLIENT_MEDIA_CACHE or
media_cache=), so each image is downloaded once; media_bytes(row) gives a row's image bytes and
images(row) its PIL images (the images extra)."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from claw_client import ClawClient, ClawError
from tests.live import LiveServer, live_server
from tests.media_support import png

pytestmark = pytest.mark.live

KEYS = """
from pool.services.api_keys import api_key_create
for name, scopes in (("agent", ["ingest"]), ("trainer", ["consume"]), ("admin", ["admin"])):
    print(api_key_create(name=name, scopes=scopes)[1])
"""
A, B, C = png(11, (96, 60)), png(12), png(13, (50, 70))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[tuple[LiveServer, dict[str, str]]]:
    with live_server(tmp_path_factory.mktemp("srv")) as srv:
        agent, trainer, admin = srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:]
        with ClawClient(srv.url, admin) as claw:
            claw.create_dataset("shots")
        yield srv, {"agent": agent, "trainer": trainer}


def submit(srv: LiveServer, key: str, uid: str, images: list[list[bytes]]) -> None:
    """One trajectory, a step per entry of ``images`` (white-box multi_modal_data, base64)."""
    steps = []
    for i, shots in enumerate(images):
        steps.append(
            {
                "trajectory_uid": uid,
                "step_index": i,
                "prompt_ids": [1, 2, 3 + i],
                "response_ids": [7, 8],
                "is_last": i == len(images) - 1,
                "multi_modal_data": {"images": [base64.b64encode(b).decode() for b in shots]},
            }
        )
    with ClawClient(srv.url, key) as agent:
        assert agent.submit_steps(steps)["created"] == len(steps)
        agent.complete_trajectory(uid, reward=1.0)


class Counting(httpx.HTTPTransport):
    """The real transport, counting the image downloads (and, if asked, flipping a byte of them)."""

    def __init__(self, *, tamper: bool = False):
        super().__init__()
        self.media_gets: list[str] = []
        self.tamper = tamper

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = super().handle_request(request)
        if "/api/v1/media/" not in request.url.path:
            return resp
        self.media_gets.append(request.url.path.rsplit("/", 1)[-1])
        if not self.tamper:
            return resp
        body = bytearray(resp.read())
        body[-1] ^= 0xFF
        return httpx.Response(resp.status_code, headers=resp.headers, content=bytes(body), request=request)


def pull_rows(claw: ClawClient, consumer: str) -> dict[str, dict]:
    with claw.pull("shots", consumer=consumer, batch_size=16, unit="steps") as batch:
        return {row["uid"]: row for row in batch.steps}


def test_a_pulled_rows_images_come_back_byte_exact_and_each_is_downloaded_once(server, tmp_path):
    srv, keys = server
    # given an agent's steps that re-send images (A in both steps)
    submit(srv, keys["agent"], "shot-1", [[A, B], [A, C]])
    transport = Counting()
    with ClawClient(srv.url, keys["trainer"], media_cache=tmp_path / "cache", transport=transport) as claw:
        rows = pull_rows(claw, "c1")
        # when the trainer asks for each row's bytes and PIL images
        got = {uid: claw.media_bytes(rows[uid]) for uid in ("shot-1:0", "shot-1:1")}
        pil = {uid: claw.images(rows[uid]) for uid in ("shot-1:0", "shot-1:1")}
        # then they are the images sent, in order, byte-exact
        assert got == {"shot-1:0": [A, B], "shot-1:1": [A, C]}
        for uid, images in pil.items():
            assert [(i.format, i.size) for i in images] == [
                ("PNG", Image.open(io.BytesIO(b)).size) for b in got[uid]
            ]
            assert [i.tobytes() for i in images] == [Image.open(io.BytesIO(b)).tobytes() for b in got[uid]]
        # and each distinct image was downloaded exactly once (A's second use and every
        # images() call were cache hits)
        assert sorted(transport.media_gets) == sorted({sha(A), sha(B), sha(C)})
        # and the cache holds each under its sha256
        for data in (A, B, C):
            assert (tmp_path / "cache" / sha(data)[:2] / sha(data)).read_bytes() == data
    # and a second client on the same cache makes no request at all
    again = Counting()
    with ClawClient(srv.url, keys["trainer"], media_cache=tmp_path / "cache", transport=again) as claw:
        assert claw.fetch_media(sha(C)) == C
    assert again.media_gets == []


def test_bytes_that_do_not_hash_to_their_name_are_refused_and_not_cached(server, tmp_path):
    srv, keys = server
    submit(srv, keys["agent"], "shot-2", [[png(21)]])
    wanted = sha(png(21))
    # given a transport that flips a byte of every image served
    transport = Counting(tamper=True)
    with ClawClient(srv.url, keys["trainer"], media_cache=tmp_path / "c", transport=transport) as claw:
        # when the image is fetched, then the mismatch is raised, naming the hash
        with pytest.raises(ClawError) as err:
            claw.fetch_media(wanted)
        assert err.value.type == "sha256_mismatch" and wanted in err.value.message
        # and nothing was cached: the next fetch asks the server again
        with pytest.raises(ClawError):
            claw.fetch_media(wanted)
        assert transport.media_gets == [wanted, wanted]
    assert not (tmp_path / "c" / wanted[:2] / wanted).exists()


def test_a_corrupted_cache_file_is_a_miss_and_is_fetched_again(server, tmp_path):
    srv, keys = server
    data = png(31)
    submit(srv, keys["agent"], "shot-3", [[data]])
    transport = Counting()
    with ClawClient(srv.url, keys["trainer"], media_cache=tmp_path / "c", transport=transport) as claw:
        assert claw.fetch_media(sha(data)) == data
        # given the cached file truncated on disk
        path = tmp_path / "c" / sha(data)[:2] / sha(data)
        path.write_bytes(data[:-10])
        # when fetched again, then the right bytes come back from the server, and are cached again
        assert claw.fetch_media(sha(data)) == data
        assert path.read_bytes() == data
    assert transport.media_gets == [sha(data), sha(data)]


def test_an_unknown_or_malformed_sha256_is_a_clear_error(server, tmp_path):
    srv, keys = server
    with ClawClient(srv.url, keys["trainer"], media_cache=tmp_path / "c") as claw:
        with pytest.raises(ClawError) as err:
            claw.fetch_media("0" * 64)
        assert err.value.status == 404
        with pytest.raises(ValueError, match="64 lowercase hex"):
            claw.fetch_media("../etc/passwd")
