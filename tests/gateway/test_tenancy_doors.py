"""The tenancy matrix's door rows (tests/test_tenancy_matrix.py holds the REST rows): the
OpenAI-compatible doors and the Claw-R1 compat endpoints against a live server, with the demo
upstream behind it.

Source A's agent made a trajectory through chat completions and a Responses chain. Another
source's ingest key may not continue, complete or submit into either: naming A's trajectory
in a gateway URL or a step answers 409 ``uid_taken``, targeting it (complete, a
``previous_response_id``) 404 as for an unknown id, in the door's error shape, and A's stored
steps stay exactly as they were. The same call with A's own key succeeds, so no row is
refused for a reason other than the source.

Such a call is refused before anything goes upstream (gateway/proxy/owners.py), streamed
calls included: the upstream never sees it, and the refusal is a plain HTTP error.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest

from tests.gateway.proxy_support import auth, upstream_received
from tests.live import LiveServer, live_server

pytestmark = pytest.mark.live

MODEL = "claw-demo"
T, G = "tenancy-a", "tenancy-a-g"
ANTHROPIC_TYPES = {404: "not_found_error", 409: "invalid_request_error"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 6}


@dataclass
class World:
    server: LiveServer
    own: str  # source A's ingest key
    other: str  # source B's ingest key
    reader: str  # a read key, to read A's rows back
    response_id: str  # A's Responses answer
    upstream: str  # the demo upstream's base URL (its test hooks count what reached it)


@pytest.fixture(scope="module")
def world(tmp_path_factory, demo_upstream) -> Iterator[World]:
    with live_server(tmp_path_factory.mktemp("tenancy"), {"CLAW_UPSTREAM_URL": demo_upstream}) as server:
        own = server.make_key("ingest", name="source-a")
        other = server.make_key("ingest", name="source-b")
        reader = server.make_key("read", name="reader")
        r = httpx.post(
            f"{server.url}/t/{T}/{G}/v1/chat/completions", json=CHAT, headers=auth(own), timeout=60
        )
        assert r.status_code == 200, r.text
        r = httpx.post(
            f"{server.url}/v1/responses",
            json={"model": MODEL, "input": "Hi.", "max_output_tokens": 6},
            headers=auth(own),
            timeout=60,
        )
        assert r.status_code == 200, r.text
        yield World(server, own, other, reader, r.json()["id"], demo_upstream)


def _chat(w: World, key: str) -> httpx.Response:
    return httpx.post(
        f"{w.server.url}/t/{T}/{G}/v1/chat/completions", json=CHAT, headers=auth(key), timeout=60
    )


def _messages(w: World, key: str) -> httpx.Response:
    body = {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": "Hello."}]}
    return httpx.post(f"{w.server.url}/t/{T}/{G}/v1/messages", json=body, headers=auth(key), timeout=60)


def _responses(w: World, key: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "input": "And then?",
        "max_output_tokens": 6,
        "previous_response_id": w.response_id,
    }
    return httpx.post(f"{w.server.url}/v1/responses", json=body, headers=auth(key), timeout=60)


def _compat_chat(w: World, key: str) -> httpx.Response:
    url = f"{w.server.url}/compat/claw-r1/k/{key}/{T}/{G}/v1/chat/completions"
    return httpx.post(url, json=CHAT, timeout=60)


def _compat_submit(w: World, key: str) -> httpx.Response:
    step = {
        "prompt_ids": [1, 2, 3],
        "response_ids": [4, 5],
        "rollout_log_probs": [-0.5, -0.25],
        "reward": None,
        "trajectory_uid": T,
        "prompt_uid": G,
        "step_index": 90,
        "policy_version": 0,
        "is_last": False,
        "metadata": {},
    }
    return httpx.post(
        f"{w.server.url}/compat/claw-r1/k/{key}/submit_steps", json={"steps": [step]}, timeout=60
    )


# (row, call, what the other source gets: (status, error code), what the owner gets)
ROWS = [
    ("chat completions into A's trajectory", _chat, (409, "uid_taken"), 200),
    ("Anthropic messages into A's trajectory", _messages, (409, "uid_taken"), 200),
    ("compat chat completions into A's trajectory", _compat_chat, (409, "uid_taken"), 200),
    ("compat submit_steps into A's trajectory", _compat_submit, (409, "uid_taken"), 200),
    ("Responses continuing A's chain", _responses, (404, None), 200),
]


def _stored(w: World) -> list[dict]:
    r = httpx.get(
        f"{w.server.url}/api/v1/steps",
        params={"trajectory_uid": T, "page_size": 500},
        headers=auth(w.reader),
        timeout=30,
    )
    r.raise_for_status()
    return sorted(r.json()["results"], key=lambda s: s["step_index"])


@pytest.mark.parametrize(("row", "call", "refused", "owner"), ROWS, ids=[r[0] for r in ROWS])
def test_another_source_cannot_write_through_the_doors(world, row, call, refused, owner):
    before = _stored(world)
    assert before, "A's trajectory holds steps"

    # when: source B's key makes the call
    r = call(world, world.other)

    # then: refused in the door's error shape, naming nothing of A's
    status, code = refused
    assert r.status_code == status, r.text
    body = r.json()
    error = body["error"]
    assert set(error) >= {"message", "type"}
    if call is _messages:  # Anthropic's shape: {"type": "error", "error": {"type", "message"}}
        assert body["type"] == "error" and error["type"] == ANTHROPIC_TYPES[status]
    elif code is not None:
        assert error["code"] == code
    assert T not in error["message"] or code == "uid_taken"  # only a taken uid is named back
    # and: A's steps are exactly as they were
    assert _stored(world) == before

    # and: the same call with A's own key is accepted
    assert call(world, world.own).status_code == owner


# --- refused before the upstream -------------------------------------------------------------------
# (door, path under the base URL, body, error shape)
DOORS = [
    ("chat", "chat/completions", CHAT, "openai"),
    ("completions", "completions", {"model": MODEL, "prompt": "Hello", "max_tokens": 6}, "openai"),
    (
        "messages",
        "messages",
        {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": "Hi"}]},
        "anthropic",
    ),
    ("responses", "responses", {"model": MODEL, "input": "Hi.", "max_output_tokens": 6}, "openai"),
]
# (how the call names A's row, the base URL (key: the caller's), extra headers, what B gets)
# {t}: a fresh trajectory uid of the caller's, {chain}: the trajectory of A's Responses answer;
# "chain" rows continue that answer (previous_response_id).
TARGETS = [
    ("trajectory in the scoped URL", "/t/" + T + "/-/v1/", {}, (409, "uid_taken")),
    ("trajectory in X-Claw-Trajectory", "/v1/", {"X-Claw-Trajectory": T}, (409, "uid_taken")),
    ("group in the scoped URL", "/t/{t}/" + G + "/v1/", {}, (409, "uid_taken")),
    ("group in X-Claw-Prompt-Group", "/v1/", {"X-Claw-Prompt-Group": G}, (409, "uid_taken")),
    (
        "compat: trajectory in the gateway URL",
        "/compat/claw-r1/k/{key}/" + T + "/-/v1/",
        {},
        (409, "uid_taken"),
    ),
    ("compat: group in the gateway URL", "/compat/claw-r1/k/{key}/{t}/" + G + "/v1/", {}, (409, "uid_taken")),
]
CHAIN = [
    ("chain: previous_response_id", "/v1/", {}, (404, "invalid_request")),
    (
        "chain: previous_response_id, compat URL",
        "/compat/claw-r1/k/{key}/{chain}/-/v1/",
        {},
        (404, "invalid_request"),
    ),
]
CASES = [
    (f"{door} {target[0]} stream={stream}", door, path, body, shape, target, stream)
    for door, path, body, shape in DOORS
    for target in TARGETS + (CHAIN if door == "responses" else [])
    for stream in (False, True)
]


def _events(w: World) -> list[dict]:
    r = httpx.get(
        f"{w.server.url}/api/v1/events", params={"page_size": 500}, headers=auth(w.reader), timeout=30
    )
    r.raise_for_status()
    return r.json()["results"]


def _trajectory_exists(w: World, uid: str) -> bool:
    r = httpx.get(f"{w.server.url}/api/v1/trajectories/{uid}", headers=auth(w.reader), timeout=30)
    assert r.status_code in (200, 404), r.text
    return r.status_code == 200


def _door_call(w: World, key: str, path: str, body: dict, target: tuple, stream: bool, tag: str, fresh: str):
    name, base, headers, _ = target
    payload = {**body, "stream": stream}
    if name.startswith("chain"):
        payload["previous_response_id"] = w.response_id
    chain = bytes.fromhex(w.response_id[5 + 24 :]).decode()  # the trajectory it names (doors/responses.py)
    url = w.server.url + base.format(t=fresh, key=key, chain=chain) + path
    h = {**auth(key), **headers, "x-test-record": tag}
    return httpx.post(url, json=payload, headers=h, timeout=60)


@pytest.mark.parametrize(
    ("case", "door", "path", "body", "shape", "target", "stream"), CASES, ids=[c[0] for c in CASES]
)
def test_another_sources_row_is_refused_before_the_upstream(
    world, case, door, path, body, shape, target, stream
):
    # given: A's trajectory, group and Responses chain, and what is stored of them
    before, events = _stored(world), _events(world)
    fresh, tag = f"b-{uuid.uuid4().hex[:10]}", f"refused-{uuid.uuid4().hex}"

    # when: B's key names one of them through a door, streamed or not
    r = _door_call(world, world.other, path, body, target, stream, tag, fresh)

    # then: a plain HTTP error in the door's shape, not a stream
    status, code = target[3]
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    got = r.json()
    if shape == "anthropic":
        assert got["type"] == "error"
        assert got["error"]["type"] == ANTHROPIC_TYPES[status]
        assert got["error"]["message"]
    else:
        assert set(got["error"]) == {"message", "type", "param", "code"}
        assert got["error"]["code"] == code
    # and: the upstream was never asked; nothing was stored (steps, trajectory, events)
    assert upstream_received(world.upstream, tag) == []
    assert _stored(world) == before
    assert not _trajectory_exists(world, fresh)
    assert _events(world) == events

    # and: the same call with A's own key reaches the upstream once and is answered
    own = _door_call(world, world.own, path, body, target, stream, tag + "-own", fresh + "-own")
    assert own.status_code == 200, own.text
    assert len(upstream_received(world.upstream, tag + "-own")) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_trajectory_claimed_while_upstream_is_refused_at_record(world, stream):
    # given: B's call into a trajectory nobody holds yet, held at the upstream (its barrier)
    uid, tag = f"race-{uuid.uuid4().hex[:10]}", f"race-{uuid.uuid4().hex}"
    barrier = {"x-test-barrier": f"{tag}:2"}
    got: dict[str, httpx.Response] = {}

    def call() -> None:
        got["r"] = httpx.post(
            f"{world.server.url}/t/{uid}/-/v1/chat/completions",
            json={**CHAT, "stream": stream},
            headers={**auth(world.other), "x-test-record": tag, **barrier},
            timeout=90,
        )

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 30
    while not upstream_received(world.upstream, tag):
        assert time.monotonic() < deadline, "the call never reached the upstream"
        time.sleep(0.02)

    # when: A claims that trajectory while the upstream works, then the upstream answers
    r = httpx.post(
        f"{world.server.url}/api/v1/trajectories", json={"uid": uid}, headers=auth(world.own), timeout=30
    )
    assert r.status_code == 201, r.text
    httpx.post(
        f"{world.upstream}/chat/completions", json=CHAT, headers=barrier, timeout=60
    ).raise_for_status()
    caller.join(90)
    assert not caller.is_alive()

    # then: B's answer is refused at record time, and A's trajectory holds nothing of it
    r = got["r"]
    if not stream:
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "uid_taken"
    else:  # the answer was already streaming: its last event says it was not recorded
        assert r.status_code == 200
        frames = [f.removeprefix("data: ") for f in r.text.strip().split("\n\n")]
        assert frames[-1] != "[DONE]"
        error = orjson.loads(frames[-1])["error"]
        assert (error["code"], "is taken" in error["message"]) == ("record_failed", True)
    traj = httpx.get(f"{world.server.url}/api/v1/trajectories/{uid}", headers=auth(world.reader), timeout=30)
    assert (traj.json()["step_count"], traj.json()["source"]) == (0, "source-a")
    steps = httpx.get(
        f"{world.server.url}/api/v1/steps",
        params={"trajectory_uid": uid},
        headers=auth(world.reader),
        timeout=30,
    )
    assert steps.json()["results"] == []
