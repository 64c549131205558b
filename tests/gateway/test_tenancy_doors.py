"""The tenancy matrix's door rows (tests/test_tenancy_matrix.py holds the REST rows): the
OpenAI-compatible doors and the Claw-R1 compat endpoints against a live server, with the demo
upstream behind it.

Source A's agent made a trajectory through chat completions and a Responses chain. Another
source's ingest key may not continue, complete or submit into either: naming A's trajectory
in a gateway URL or a step answers 409 ``uid_taken``, targeting it (complete, a
``previous_response_id``) 404 as for an unknown id, in the door's error shape, and A's stored
steps stay exactly as they were. The same call with A's own key succeeds, so no row is
refused for a reason other than the source.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.gateway.proxy_support import auth
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
        yield World(server, own, other, reader, r.json()["id"])


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
