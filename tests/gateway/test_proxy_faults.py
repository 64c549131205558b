"""Upstream faults through the OpenAI gateway (live server, official `openai` client):
connection refused -> 502, CLAW_UPSTREAM_TIMEOUT -> 504, upstream 4xx/5xx passed through
with its body; each recorded as an Event, never as a step; the upstream key never leaks."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.gateway.proxy_support import auth, events_of, steps_of, trajectory_of
from tests.live import LiveServer, live_server, refused_port

pytestmark = pytest.mark.live

MODEL = "claw-demo"
SECRET = "sk-upstream-secret-7f3a9c"
MESSAGES = [{"role": "user", "content": "hello"}]


@dataclass
class Gateway:
    server: LiveServer
    key: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.server.url}/v1", api_key=self.key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def gw(tmp_path_factory, demo_upstream) -> Iterator[Gateway]:
    env = {"CLAW_UPSTREAM_URL": demo_upstream, "CLAW_UPSTREAM_TIMEOUT": "1", "CLAW_UPSTREAM_API_KEY": SECRET}
    with live_server(tmp_path_factory.mktemp("faults"), env) as server:
        yield Gateway(server, server.make_key("ingest", "read"))


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> Iterator[Gateway]:
    with (
        refused_port() as closed,  # bound but not listening, for as long as the fixture lives
        live_server(
            tmp_path_factory.mktemp("refused"), {"CLAW_UPSTREAM_URL": f"http://127.0.0.1:{closed}/v1"}
        ) as server,
    ):
        yield Gateway(server, server.make_key("ingest", "read"))


def _no_step_stored(gw: Gateway, traj: str) -> None:
    assert steps_of(gw.server, gw.key, traj) == []
    assert trajectory_of(gw.server, gw.key, traj).status_code == 404  # no empty trajectory either


@pytest.mark.parametrize(
    "status,error",
    [
        (400, openai.BadRequestError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
        (503, openai.InternalServerError),
    ],
)
def test_upstream_errors_pass_through_with_their_body(gw, status, error):
    # given: an upstream that answers an error
    # when
    with pytest.raises(error) as exc:
        gw.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"x-demo-fail": str(status)}
        )

    # then: the agent gets the upstream's status and body
    assert exc.value.status_code == status
    assert exc.value.body["message"] == f"forced failure {status} (x-demo-fail)"
    traj = exc.value.response.headers["x-claw-trajectory"]
    # and: an Event, no step
    [event] = events_of(gw.server, gw.key, "upstream_error", traj)
    assert event["payload"]["status"] == status and event["payload"]["kind"] == "http_error"
    _no_step_stored(gw, traj)


def test_a_streamed_call_that_fails_upfront_passes_the_error_through(gw):
    # given / when: stream=True and the upstream answers 429
    with pytest.raises(openai.RateLimitError) as exc:
        gw.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, extra_headers={"x-demo-fail": "429"}
        )

    # then
    traj = exc.value.response.headers["x-claw-trajectory"]
    assert events_of(gw.server, gw.key, "upstream_error", traj)[0]["payload"]["status"] == 429
    _no_step_stored(gw, traj)


def test_a_slow_upstream_times_out_with_504(gw):
    # given: an upstream slower than CLAW_UPSTREAM_TIMEOUT (1 s)
    # when
    with pytest.raises(openai.InternalServerError) as exc:
        gw.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"x-demo-delay-ms": "2500"}
        )

    # then: 504 in OpenAI's error shape, an Event, no step
    assert exc.value.status_code == 504
    assert exc.value.body["code"] == "timeout"
    traj = exc.value.response.headers["x-claw-trajectory"]
    assert events_of(gw.server, gw.key, "upstream_error", traj)[0]["payload"]["kind"] == "timeout"
    _no_step_stored(gw, traj)


def test_a_slow_stream_times_out_with_504(gw):
    with pytest.raises(openai.InternalServerError) as exc:
        gw.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, stream=True, extra_headers={"x-demo-delay-ms": "2500"}
        )
    assert exc.value.status_code == 504
    _no_step_stored(gw, exc.value.response.headers["x-claw-trajectory"])


def test_an_answer_cut_mid_body_is_a_502_and_stores_nothing(gw):
    # given: the upstream sends half a JSON body, then closes the connection
    with pytest.raises(openai.InternalServerError) as exc:
        gw.client().chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"x-demo-drop": "1"}
        )

    # then
    assert exc.value.status_code == 502
    traj = exc.value.response.headers["x-claw-trajectory"]
    assert (
        events_of(gw.server, gw.key, "upstream_error", traj)[0]["payload"]["kind"] == "upstream_disconnected"
    )
    _no_step_stored(gw, traj)


def test_a_stream_cut_midway_ends_with_an_error_event_and_stores_nothing(gw):
    # given: a named trajectory whose stream breaks after its first chunk
    traj = "cut-stream"

    # when / then: the SDK raises the error event the gateway sends instead of [DONE]
    with pytest.raises(openai.APIError):
        for _ in gw.client().chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            extra_headers={"x-demo-drop": "1", "X-Claw-Trajectory": traj},
        ):
            pass
    [event] = events_of(gw.server, gw.key, "upstream_error", traj)
    assert event["payload"]["kind"] in ("upstream_disconnected", "stream_incomplete")
    _no_step_stored(gw, traj)


def test_the_upstream_key_is_sent_nowhere_but_upstream(gw):
    # given: a failing and a succeeding call
    r1 = httpx.post(
        f"{gw.server.url}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers={**auth(gw.key), "x-demo-fail": "401"},
    )
    r2 = httpx.post(
        f"{gw.server.url}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES},
        headers=auth(gw.key),
    )

    # then: neither answers, nor events, nor steps, nor the server log contain the secret
    events = httpx.get(f"{gw.server.url}/api/v1/events", headers=auth(gw.key)).text
    steps = httpx.get(f"{gw.server.url}/api/v1/steps", headers=auth(gw.key)).text
    assert r1.status_code == 401 and r2.status_code == 200
    for text in (
        r1.text,
        str(r1.headers),
        r2.text,
        str(r2.headers),
        events,
        steps,
        gw.server.log_path.read_text(),
    ):
        assert SECRET not in text


def test_connection_refused_is_a_502(refused):
    # given: nothing listens at CLAW_UPSTREAM_URL
    # when
    with pytest.raises(openai.InternalServerError) as exc:
        refused.client().chat.completions.create(model=MODEL, messages=MESSAGES)

    # then
    assert exc.value.status_code == 502
    assert exc.value.body["code"] == "connect_error"
    traj = exc.value.response.headers["x-claw-trajectory"]
    assert (
        events_of(refused.server, refused.key, "upstream_error", traj)[0]["payload"]["kind"]
        == "connect_error"
    )
    _no_step_stored(refused, traj)


def test_connection_refused_on_stream_and_models_is_a_502(refused):
    with pytest.raises(openai.InternalServerError) as exc:
        refused.client().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert exc.value.status_code == 502
    with pytest.raises(openai.InternalServerError) as exc:
        refused.client().models.list()
    assert exc.value.status_code == 502
