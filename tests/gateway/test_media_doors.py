"""Images through every door (issue 24), against a live server and the demo upstream rendering
each image as 256 placeholder ids: the official openai SDK (chat ``image_url`` with a data URL,
Responses ``input_image``), the official anthropic SDK (``image`` block, base64 source),
white-box steps in JSON and MessagePack, and Claw-R1's ``submit_steps``. Two steps send the
same image: it is stored once, each step's images come back in order through reads, both
pull formats and a byte-exact download, with where they sit in the prompt."""

from __future__ import annotations

import base64
import hashlib
import io
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import anthropic
import httpx
import msgspec
import openai
import orjson
import pytest
from PIL import Image

from tests.gateway.conftest import start_upstream
from tests.gateway.proxy_support import auth, steps_of, upstream_received
from tests.live import LiveServer, listening_socket, live_server, stop_process

pytestmark = pytest.mark.live

MODEL = "claw-demo"
PAD, N_PAD = 151655, 256


@dataclass
class Gateway:
    server: LiveServer
    key: str
    upstream: str
    admin: str
    trainer: str

    def openai(self, trajectory: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=30,
            default_headers={"X-Claw-Trajectory": trajectory, "x-test-record": trajectory},
        )  # fmt: skip

    def anthropic(self, trajectory: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=self.server.url, api_key=self.key, max_retries=0, timeout=30,
            default_headers={"X-Claw-Trajectory": trajectory, "x-test-record": trajectory},
        )  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory) -> Iterator[Gateway]:
    upstream, proc = start_upstream("--image-tokens", str(N_PAD))
    try:
        env = {"CLAW_UPSTREAM_URL": upstream, "CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS": str(PAD)}
        with live_server(tmp_path_factory.mktemp("media"), env) as server:
            yield Gateway(
                server,
                server.make_key("ingest", "read"),
                upstream,
                server.make_key("admin"),
                server.make_key("consume"),
            )
    finally:
        stop_process(proc)


def screenshot(seed: int) -> bytes:
    image = Image.new("RGB", (64, 40), (seed * 40 % 256, 200, 120))
    for x in range(seed % 9, 64, 9):
        image.putpixel((x, seed % 40), (0, 0, 0))
    image.putpixel((0, 0), (seed & 255, (seed >> 8) & 255, 7))  # distinct per seed
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes) -> str:
    return f"data:image/png;base64,{b64(data)}"


# --- the doors: each sends turn ``i`` of a trajectory with ``images`` -----------------------------
def chat_turn(gw: Gateway, traj: str, i: int, images: list[bytes]) -> None:
    content = [{"type": "text", "text": f"turn {i}: what do you see?"}]
    content += [{"type": "image_url", "image_url": {"url": data_url(d)}} for d in images]
    gw.openai(traj).chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": content}]
    )


def anthropic_turn(gw: Gateway, traj: str, i: int, images: list[bytes]) -> None:
    content = [{"type": "text", "text": f"turn {i}: what do you see?"}]
    content += [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(d)}}
        for d in images
    ]
    gw.anthropic(traj).messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": content}]
    )


def responses_turn(gw: Gateway, traj: str, i: int, images: list[bytes]) -> None:
    content = [{"type": "input_text", "text": f"turn {i}: what do you see?"}]
    content += [{"type": "input_image", "image_url": data_url(d)} for d in images]
    gw.openai(traj).responses.create(
        model=MODEL, max_output_tokens=8, input=[{"role": "user", "content": content}]
    )


def _white_box(traj: str, i: int, images: list) -> dict:
    prompt = [5 + i]
    for _ in images:
        prompt += [3] + [PAD] * N_PAD + [4]
    return {
        "trajectory_uid": traj, "step_index": i, "prompt_ids": prompt, "response_ids": [7, 8],
        "multi_modal_data": {"images": images},
    }  # fmt: skip


def json_turn(gw: Gateway, traj: str, i: int, images: list[bytes]) -> None:
    step = _white_box(traj, i, [b64(d) if k % 2 else data_url(d) for k, d in enumerate(images)])
    r = httpx.post(f"{gw.server.url}/api/v1/steps", json={"steps": [step]}, headers=auth(gw.key), timeout=30)
    assert r.status_code == 201, r.text


def msgpack_turn(gw: Gateway, traj: str, i: int, images: list[bytes]) -> None:
    body = msgspec.msgpack.encode({"steps": [_white_box(traj, i, list(images))]})  # images as bin
    r = httpx.post(
        f"{gw.server.url}/api/v1/steps", content=body, timeout=30,
        headers={**auth(gw.key), "Content-Type": "application/msgpack"},
    )  # fmt: skip
    assert r.status_code == 201, r.text


def claw_r1_turn(gw: Gateway, traj: str, i: int, images: list[bytes]) -> None:
    step = _white_box(traj, i, [b64(d) for d in images])
    step["prompt_uid"] = f"{traj}-g"
    r = httpx.post(
        f"{gw.server.url}/compat/claw-r1/k/{gw.key}/submit_steps", json={"steps": [step]}, timeout=30
    )
    assert r.status_code == 200 and r.json() == {"accepted": 1}, r.text


# (door, send a turn, proxied?, the chat message index and first part index of the images)
DOORS: list[tuple[str, Callable[[Gateway, str, int, list[bytes]], None], bool, int | None, int | None]] = [
    ("openai chat image_url", chat_turn, True, 0, 1),
    ("anthropic image block", anthropic_turn, True, 0, 1),
    ("openai responses input_image", responses_turn, True, 0, 1),
    ("white-box JSON multi_modal_data", json_turn, False, None, None),
    ("white-box msgpack multi_modal_data", msgpack_turn, False, None, None),
    ("Claw-R1 submit_steps multi_modal_data", claw_r1_turn, False, None, None),
]


def media_count(gw: Gateway) -> int:
    out = gw.server.manage("shell", "-c", "from pool.models import Media; print(Media.objects.count())")
    return int(out.strip().splitlines()[-1])


def pull(gw: Gateway, dataset: str, fmt: str) -> dict:
    r = httpx.post(
        f"{gw.server.url}/api/v1/consumers/media-{fmt}-{dataset}/pull",
        json={"dataset": dataset, "batch_size": 64, "format": fmt, "unit": "steps"},
        headers=auth(gw.trainer), timeout=60,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["batch"]


@pytest.mark.parametrize(
    ("door", "send", "proxied", "message_index", "part_index"), DOORS, ids=[d[0] for d in DOORS]
)
def test_each_door_stores_an_image_once_and_serves_it_back_byte_exact(
    gw, door, send, proxied, message_index, part_index
):
    # given: a trajectory of two turns; the second re-sends the first's screenshot, then a new one
    run = uuid.uuid4()
    traj = f"img-{run.hex[:8]}"
    seed = run.int % 30000 * 2
    first, second = screenshot(seed), screenshot(seed + 1)
    turns = [[first], [first, second]]
    before = media_count(gw)
    # when: the agent sends both turns through the door
    for i, images in enumerate(turns):
        send(gw, traj, i, images)
    # then: two distinct images are stored, once each, whatever the number of references
    assert media_count(gw) == before + 2
    stored = steps_of(gw.server, gw.key, traj)
    assert len(stored) == 2
    for step, images in zip(stored, turns, strict=True):
        refs = step["images"]
        assert [r["sha256"] for r in refs] == [hashlib.sha256(d).hexdigest() for d in images]
        for k, (r, data) in enumerate(zip(refs, images, strict=True)):
            assert (r["kind"], r["media_type"], r["width"], r["height"]) == ("stored", "image/png", 64, 40)
            assert (r["message_index"], r["part_index"]) == (
                message_index, part_index + k if part_index is not None else None
            )  # fmt: skip
            # each image's run of placeholder ids, in order, where the prompt ids show it
            assert step["prompt_ids"][r["token_start"] : r["token_end"]] == [PAD] * N_PAD
            # and: the download is byte-exact, with its checked type
            dl = httpx.get(f"{gw.server.url}{r['url']}", headers=auth(gw.trainer), timeout=30)
            assert (
                dl.status_code == 200 and hashlib.sha256(dl.content).digest() == hashlib.sha256(data).digest()
            )
            assert (
                dl.headers["content-type"] == "image/png"
                and dl.headers["x-content-type-options"] == "nosniff"
            )
        if proxied:
            # the stored messages hold each image's download path, not its bytes again
            assert b"base64" not in orjson.dumps(step["messages"])
    if proxied:
        # and: the upstream received the request as the agent sent it (the data URLs unchanged)
        sent = orjson.dumps(upstream_received(gw.upstream, traj))
        assert b64(second).encode() in sent and b64(first).encode() in sent
    # and: a trainer's pull carries the same references, in the steps and padded formats
    ds = f"ds-{traj}"
    r = httpx.post(
        f"{gw.server.url}/api/v1/datasets",
        json={"name": ds, "filters": {"readiness": "any"}},
        headers=auth(gw.admin), timeout=30,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    want = {s["uid"]: [im["sha256"] for im in s["images"]] for s in stored}
    steps_batch = pull(gw, ds, "steps")["steps"]
    got = {s["uid"]: [im["sha256"] for im in s["images"]] for s in steps_batch if s["trajectory_uid"] == traj}
    assert got == want
    padded_batch = pull(gw, ds, "padded")
    got = {
        uid: [im["sha256"] for im in images]
        for uid, t, images in zip(
            padded_batch["uid"], padded_batch["trajectory_uid"], padded_batch["images"], strict=True
        )
        if t == traj
    }
    assert got == want


def test_a_remote_image_url_is_passed_through_and_never_fetched(gw):
    # given: an address the gateway could fetch (a socket listening, never accepting)
    with listening_socket() as sock:
        sock.setblocking(False)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/cat.png"
        traj = f"url-{uuid.uuid4().hex[:8]}"
        # when: an agent sends it as an image_url part
        gw.openai(traj).chat.completions.create(
            model=MODEL, max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]}],
        )  # fmt: skip
        # then: the step keeps it as a reference only, the upstream got it unchanged, and no
        # connection ever reached that address (the call was answered after recording)
        with pytest.raises(BlockingIOError):
            sock.accept()
    (step,) = steps_of(gw.server, gw.key, traj)
    (ref,) = step["images"]
    assert (ref["kind"], ref["url"], ref["sha256"], ref["message_index"], ref["part_index"]) == (
        "url",
        url,
        None,
        0,
        1,
    )
    assert url.encode() in orjson.dumps(upstream_received(gw.upstream, traj))


def test_a_proxied_call_with_a_bad_image_is_refused_in_the_doors_shape_before_going_upstream(gw):
    # given: an OpenAI and an Anthropic agent sending bytes that are not a PNG
    traj = f"bad-{uuid.uuid4().hex[:8]}"
    bad = b64(b"not a png at all")
    # when / then: each is refused 400 in its own error shape, naming the image's field
    with pytest.raises(openai.BadRequestError) as oe:
        gw.openai(traj).chat.completions.create(
            model=MODEL, max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{bad}"}}]}],
        )  # fmt: skip
    assert oe.value.body["param"] == "messages[0].content[0].image_url.url", oe.value.body
    with pytest.raises(anthropic.BadRequestError) as ae:
        gw.anthropic(traj).messages.create(
            model=MODEL, max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": bad}}]}],
        )  # fmt: skip
    assert ae.value.body["type"] == "error" and "PNG" in ae.value.body["error"]["message"], ae.value.body
    # and: nothing went upstream, nothing was stored
    assert upstream_received(gw.upstream, traj) == []
    assert steps_of(gw.server, gw.key, traj) == []
