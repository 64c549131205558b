"""Bad input on every write endpoint: a 4xx JSON error in the OpenAI-like shape whose
``param`` names the offending field, and nothing written.

Each step case sends a batch of [a valid step, the bad step]: the valid one creates a new
trajectory, prompt group and policy version, so a partial write would change the row counts.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from pool.ingest.pipeline import steps_ingest
from pool.models import Scope, Source, Step, Trajectory
from pool.services.api_keys import api_key_create
from tests.conftest import client_for, make_step
from tests.live import live_server
from tests.pool.factories import pool_counts, step_in

pytestmark = pytest.mark.django_db

RAW = "__raw__"  # placeholder replaced by a raw (non-JSON-standard) literal, e.g. NaN
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
}


def encode(obj: Any, raw: str | None = None) -> bytes:
    """JSON bytes of ``obj``; the string "__raw__" is replaced by ``raw`` verbatim."""
    text = json.dumps(obj)
    if raw is not None:
        assert text.count(f'"{RAW}"') == 1
        text = text.replace(f'"{RAW}"', raw)
    return text.encode()


def post_raw(client, url: str, body: bytes):
    return client.post(url, data=body, content_type="application/json")


def assert_error(resp, status: int, param: str | None) -> dict:
    """The response is the API's error shape with this status and ``param``."""
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"type", "code", "message", "param"}
    assert err["type"] == TYPES[status]
    assert err["param"] == param, err
    assert isinstance(err["message"], str) and err["message"]
    return err


def good_step() -> dict:
    """A valid step (8 tokens) that creates trajectory, group and policy version rows."""
    return make_step(
        "good-t", 0, group="good-g", prompt=[1, 2, 3, 4, 5, 6], response=[7, 8], policy_version=7
    )


def bad_step(**changes: Any) -> dict:
    step = make_step("bad-t", 0, group="bad-g", prompt=[11, 12, 13, 14], response=[15, 16, 17])
    for key, value in changes.items():
        if value is DROP:
            del step[key]
        else:
            step[key] = value
    return step


DROP = object()

# (id, changes to the second step, raw literal for "__raw__", expected param)
STEP_CASES = [
    ("step_index-string", {"step_index": "1"}, None, "steps[1].step_index"),
    ("step_index-float", {"step_index": 1.0}, None, "steps[1].step_index"),
    ("step_index-bool", {"step_index": True}, None, "steps[1].step_index"),
    ("step_index-negative", {"step_index": -1}, None, "steps[1].step_index"),
    ("prompt_ids-string", {"prompt_ids": "11 12 13"}, None, "steps[1].prompt_ids"),
    ("prompt_ids-object", {"prompt_ids": {"0": 11}}, None, "steps[1].prompt_ids"),
    ("response_ids-null", {"response_ids": None}, None, "steps[1].response_ids"),
    ("prompt_ids-empty", {"prompt_ids": []}, None, "steps[1].prompt_ids"),
    ("token-float", {"prompt_ids": [1, 2.5, 3]}, None, "steps[1].prompt_ids[1]"),
    ("token-integral-float", {"prompt_ids": [1, 2, 3.0]}, None, "steps[1].prompt_ids[2]"),
    ("token-string", {"response_ids": [1, "2"]}, None, "steps[1].response_ids[1]"),
    ("token-null", {"response_ids": [None]}, None, "steps[1].response_ids[0]"),
    ("token-list", {"response_ids": [[1]]}, None, "steps[1].response_ids[0]"),
    ("token-negative", {"prompt_ids": [0, 1, -1]}, None, "steps[1].prompt_ids[2]"),
    ("token-negative-response", {"response_ids": [-7]}, None, "steps[1].response_ids[0]"),
    ("token-2^31", {"prompt_ids": [5, 2**31]}, None, "steps[1].prompt_ids[1]"),
    ("token-2^31-response", {"response_ids": [2**31]}, None, "steps[1].response_ids[0]"),
    ("token-2^32", {"response_ids": [2**32]}, None, "steps[1].response_ids[0]"),
    ("token-2^64+1", {"prompt_ids": [2**64 + 1]}, None, "steps[1].prompt_ids[0]"),
    ("token-below-int32", {"prompt_ids": [-(2**31) - 1]}, None, "steps[1].prompt_ids[0]"),
    ("logprobs-short", {"rollout_logprobs": [-0.1, -0.2]}, None, "steps[1].rollout_logprobs"),
    ("logprobs-long", {"rollout_logprobs": [-0.1, -0.2, -0.3, -0.4]}, None, "steps[1].rollout_logprobs"),
    (
        "logprobs-without-response",
        {"response_ids": [], "rollout_logprobs": [-0.1]},
        None,
        "steps[1].rollout_logprobs",
    ),
    ("logprobs-string", {"rollout_logprobs": "x"}, None, "steps[1].rollout_logprobs"),
    ("logprobs-string-item", {"rollout_logprobs": [-0.1, "a", -0.3]}, None, "steps[1].rollout_logprobs[1]"),
    ("logprobs-nan", {"rollout_logprobs": [-0.1, -0.2, RAW]}, "NaN", "steps[1].rollout_logprobs[2]"),
    ("reward-NaN", {"reward": RAW}, "NaN", "steps[1].reward"),
    ("reward-Infinity", {"reward": RAW}, "Infinity", "steps[1].reward"),
    ("reward--Infinity", {"reward": RAW}, "-Infinity", "steps[1].reward"),
    ("reward-1e999", {"reward": RAW}, "1e999", "steps[1].reward"),
    ("reward--1e999", {"reward": RAW}, "-1e999", "steps[1].reward"),
    ("reward-string", {"reward": "1.0"}, None, "steps[1].reward"),
    ("reward-bool", {"reward": True}, None, "steps[1].reward"),
    ("reward_source-unknown", {"reward": 1.0, "reward_source": "oracle"}, None, "steps[1].reward_source"),
    ("metadata-list", {"metadata": [1]}, None, "steps[1].metadata"),
    ("metadata-string", {"metadata": "x"}, None, "steps[1].metadata"),
    ("is_last-string", {"is_last": "true"}, None, "steps[1].is_last"),
    ("is_last-int", {"is_last": 1}, None, "steps[1].is_last"),
    ("trajectory_uid-int", {"trajectory_uid": 5}, None, "steps[1].trajectory_uid"),
    ("trajectory_uid-empty", {"trajectory_uid": ""}, None, "steps[1].trajectory_uid"),
    ("trajectory_uid-too-long", {"trajectory_uid": "t" * 129}, None, "steps[1].trajectory_uid"),
    ("uid-float", {"uid": 1.5}, None, "steps[1].uid"),
    ("uid-too-long", {"uid": "s" * 161}, None, "steps[1].uid"),  # the column's 160
    ("prompt_group_uid-list", {"prompt_group_uid": ["g"]}, None, "steps[1].prompt_group_uid"),
    ("policy_version-string", {"policy_version": "3"}, None, "steps[1].policy_version"),
    ("policy_version-negative", {"policy_version": -1}, None, "steps[1].policy_version"),
    ("finish_reason-int", {"finish_reason": 3}, None, "steps[1].finish_reason"),
    ("finish_reason-too-long", {"finish_reason": "x" * 33}, None, "steps[1].finish_reason"),
    ("messages-object", {"messages": {"role": "user"}}, None, "steps[1].messages"),
    ("response_text-list", {"response_text": ["a"]}, None, "steps[1].response_text"),
    ("unknown-field", {"rewards": 1.0}, None, "steps[1].rewards"),
    ("missing-trajectory_uid", {"trajectory_uid": DROP}, None, "steps[1].trajectory_uid"),
    ("missing-step_index", {"step_index": DROP}, None, "steps[1].step_index"),
    ("missing-prompt_ids", {"prompt_ids": DROP}, None, "steps[1].prompt_ids"),
    ("missing-response_ids", {"response_ids": DROP}, None, "steps[1].response_ids"),
    ("uid-repeated-in-batch", {"uid": "good-t-s0"}, None, "steps[1].uid"),
    ("position-repeated-in-batch", {"trajectory_uid": "good-t", "uid": "other"}, None, "steps[1].step_index"),
]

# Cases found by this suite and fixed in gateway/validation.py (typed decoding + storable JSON).
STEP_EDGE_CASES = [
    pytest.param({"prompt_ids": [True, 12]}, None, "steps[1].prompt_ids[0]", id="token-bool"),
    pytest.param({"step_index": 2**31}, None, "steps[1].step_index", id="step_index-2^31"),
    pytest.param({"metadata": {"x": RAW}}, "NaN", "steps[1].metadata.x", id="metadata-NaN"),
    pytest.param({"metadata": {"x": 2**70}}, None, "steps[1].metadata.x", id="metadata-int-beyond-64-bit"),
    pytest.param({"trajectory_uid": "bad\u0000t"}, None, "steps[1].trajectory_uid", id="trajectory_uid-NUL"),
    pytest.param({"response_text": "a\u0000b"}, None, "steps[1].response_text", id="response_text-NUL"),
]


@pytest.mark.parametrize(
    ("changes", "raw", "param"), [pytest.param(c, r, p, id=i) for i, c, r, p in STEP_CASES]
)
def test_bad_step_is_rejected_naming_the_field_and_nothing_is_written(agent, changes, raw, param):
    # given a valid step followed by one bad one in the same batch
    body = encode({"steps": [good_step(), bad_step(**changes)]}, raw)
    before = pool_counts()
    # when the batch is posted
    resp = post_raw(agent, "/api/v1/steps", body)
    # then a 400 names the field and no row of any table was written
    assert_error(resp, 400, param)
    assert pool_counts() == before


@pytest.mark.parametrize(("changes", "raw", "param"), STEP_EDGE_CASES)
def test_bad_step_edge_cases(agent, changes, raw, param):
    # given a valid step followed by a bad one
    body = encode({"steps": [good_step(), bad_step(**changes)]}, raw)
    before = pool_counts()
    # when posted
    resp = post_raw(agent, "/api/v1/steps", body)
    # then 400 naming the field, nothing written
    assert_error(resp, 400, param)
    assert pool_counts() == before


def test_the_valid_step_alone_is_accepted(agent):
    # given the valid half of every case above (the control: the cases fail for the bad step)
    body = encode({"steps": [good_step(), bad_step()]})
    # when posted
    resp = post_raw(agent, "/api/v1/steps", body)
    # then both are created
    assert resp.status_code == 201, resp.content
    assert Step.objects.count() == 2


@pytest.mark.parametrize(
    "body",
    [
        b'{"steps": [',
        b"{'steps': []}",
        b'{"steps": []} trailing',
        b'{"steps": "\xff\xfe"}',
        b"{steps: 1}",
        b'{"steps": [NaN',
    ],
    ids=[
        "truncated",
        "single-quotes",
        "trailing-garbage",
        "invalid-utf8",
        "unquoted-key",
        "truncated-after-NaN",
    ],
)
def test_malformed_json_is_a_parse_error(agent, body):
    # given a body that is not JSON
    before = pool_counts()
    # when posted as application/json
    resp = post_raw(agent, "/api/v1/steps", body)
    # then 400 parse_error (no field to name), nothing written
    err = assert_error(resp, 400, None)
    assert err["code"] == "parse_error"
    assert "malformed JSON" in err["message"]
    assert pool_counts() == before


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"[]", "steps"),
        (b"null", "steps"),
        (b"42", "steps"),
        (b'"steps"', "steps"),
        (b'{"steps": {}}', "steps"),
        (b'{"steps": "abc"}', "steps"),
        (b'{"steps": []}', "steps"),
        (b'{"steps": [1]}', "steps[0]"),
        (b'{"steps": [null]}', "steps[0]"),
        (b"", "steps"),
    ],
    ids=[
        "array",
        "null",
        "number",
        "string",
        "steps-object",
        "steps-string",
        "empty-batch",
        "step-number",
        "step-null",
        "empty-body",
    ],
)
def test_wrong_shape_of_the_body(agent, body, param):
    # given a JSON body of the wrong shape
    before = pool_counts()
    # when posted
    resp = post_raw(agent, "/api/v1/steps", body)
    # then 400 names the field
    assert_error(resp, 400, param)
    assert pool_counts() == before


def test_unknown_top_level_field(agent):
    # given a valid batch with an extra top-level key
    body = encode({"steps": [good_step()], "extra": True})
    before = pool_counts()
    # when posted
    resp = post_raw(agent, "/api/v1/steps", body)
    # then the key is named and nothing written
    assert_error(resp, 400, "extra")
    assert pool_counts() == before


def test_unsupported_content_type_is_415(agent):
    # given a JSON text sent as text/plain
    before = pool_counts()
    # when posted
    resp = agent.post("/api/v1/steps", data=encode({"steps": [good_step()]}), content_type="text/plain")
    # then 415, nothing written
    assert_error(resp, 415, None)
    assert pool_counts() == before


def test_batch_over_the_step_limit(agent, settings):
    # given a limit of 3 steps per batch
    settings.CLAW_MAX_STEPS_PER_BATCH = 3
    steps = [make_step("lim", i, prompt=[1, 2], response=[3]) for i in range(4)]
    before = pool_counts()
    # when 4 steps are posted
    resp = post_raw(agent, "/api/v1/steps", encode({"steps": steps}))
    # then 400 on "steps", nothing written; 3 steps are fine
    assert_error(resp, 400, "steps")
    assert pool_counts() == before
    assert post_raw(agent, "/api/v1/steps", encode({"steps": steps[:3]})).status_code == 201


@pytest.mark.parametrize(
    ("prompt", "response", "params"),
    [
        (9, 0, {"steps[1].prompt_ids"}),
        (1, 9, {"steps[1].response_ids"}),
        (5, 4, {"steps[1].prompt_ids", "steps[1].response_ids"}),
    ],
    ids=["prompt-alone", "response-alone", "sum"],
)
def test_more_tokens_than_the_per_step_limit(agent, settings, prompt, response, params):
    # given a limit of 8 tokens per step (the valid step holds exactly 8)
    settings.CLAW_MAX_TOKENS_PER_STEP = 8
    bad = bad_step(prompt_ids=list(range(1, prompt + 1)), response_ids=list(range(1, response + 1)))
    before = pool_counts()
    # when a step with 9 tokens is posted after it
    resp = post_raw(agent, "/api/v1/steps", encode({"steps": [good_step(), bad]}))
    # then 400 names the token field, nothing written
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] in params
    assert pool_counts() == before


def test_exactly_the_token_limit_is_accepted(agent, settings):
    # given the limit equal to the valid step's 8 tokens
    settings.CLAW_MAX_TOKENS_PER_STEP = 8
    # when it is posted
    resp = post_raw(agent, "/api/v1/steps", encode({"steps": [good_step()]}))
    # then it is stored
    assert resp.status_code == 201, resp.content


def test_body_over_the_size_limit_is_413(agent, settings):
    # given a 512-byte body limit
    settings.CLAW_MAX_BODY_BYTES = 512
    small = encode({"steps": [good_step()]})
    big = encode({"steps": [good_step(), bad_step(metadata={"pad": "x" * 600})]})
    assert len(small) < 512 < len(big)
    before = pool_counts()
    # when a larger body is posted
    resp = post_raw(agent, "/api/v1/steps", big)
    # then 413, nothing written; a body under the limit passes
    err = assert_error(resp, 413, None)
    assert err["code"] == "payload_too_large"
    assert pool_counts() == before
    assert post_raw(agent, "/api/v1/steps", small).status_code == 201


@pytest.fixture(scope="module")
def small_body_server(tmp_path_factory):
    """A server process started with a 2 KiB body limit, and headers with an ingest key."""
    with live_server(tmp_path_factory.mktemp("live413"), extra_env={"CLAW_MAX_BODY_BYTES": "2048"}) as server:
        key = server.make_key("ingest", "read")
        yield server, {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}


BIG = encode({"steps": [make_step("live", 0, prompt=list(range(1000)), response=[1])]})
SMALL = encode({"steps": [make_step("live", 0, prompt=[1, 2, 3], response=[4])]})


@pytest.mark.live
def test_body_over_the_size_limit_is_413_on_a_live_server(small_body_server):
    server, h = small_body_server
    assert len(BIG) > 2048 > len(SMALL)
    # when a larger body is sent
    resp = httpx.post(f"{server.url}/api/v1/steps", content=BIG, headers=h)
    # then 413 in the error shape, and nothing was stored
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "payload_too_large"
    assert httpx.get(f"{server.url}/api/v1/stats", headers=h).json()["steps"] == 0
    # and a small body on the same server is accepted
    assert httpx.post(f"{server.url}/api/v1/steps", content=SMALL, headers=h).status_code in (200, 201)


@pytest.mark.live
def test_chunked_body_is_parsed_and_limited_on_a_live_server(small_body_server):
    server, h = small_body_server
    # when the bodies are sent chunked (Transfer-Encoding: chunked, no Content-Length)
    big = httpx.post(f"{server.url}/api/v1/steps", content=iter([BIG[:1000], BIG[1000:]]), headers=h)
    small = httpx.post(f"{server.url}/api/v1/steps", content=iter([SMALL[:10], SMALL[10:]]), headers=h)
    # then the big one is 413 and the small one is stored
    assert big.status_code == 413, big.text
    assert small.status_code in (200, 201), small.text


# --- authentication and scopes --------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer claw_000000000000_not-a-real-key",
        "Bearer not-even-the-format",
        "Basic dXNlcjpwdw==",
        "Bearer",
        "Bearer    ",
        "Token claw_x_y",
        "claw_abc_def",
    ],
    ids=[
        "missing",
        "wrong-key",
        "not-a-claw-key",
        "basic-auth",
        "bearer-alone",
        "bearer-blank",
        "token-scheme",
        "no-scheme",
    ],
)
def test_missing_wrong_or_malformed_key_is_401(header):
    # given a client with no or a bad Authorization header
    client = client_for(None)
    if header is not None:
        client.credentials(HTTP_AUTHORIZATION=header)
    before = pool_counts()
    # when it posts steps and reads them
    resp = post_raw(client, "/api/v1/steps", encode({"steps": [good_step()]}))
    read = client.get("/api/v1/steps")
    # then both are 401 with a Bearer challenge, nothing written
    for r in (resp, read):
        assert_error(r, 401, None)
        assert r["WWW-Authenticate"].startswith("Bearer")
    assert pool_counts() == before


def test_revoked_key_is_401(make_key):
    # given a working key that is then revoked
    key = make_key(Scope.INGEST)
    client = client_for(key)
    assert client.get("/api/v1/steps").status_code == 200
    from django.utils import timezone

    from pool.models import ApiKey

    ApiKey.objects.filter(prefix=key.split("_")[1]).update(revoked_at=timezone.now())
    # when it is used again
    resp = post_raw(client, "/api/v1/steps", encode({"steps": [good_step()]}))
    # then 401, nothing written
    assert_error(resp, 401, None)
    assert Step.objects.count() == 0


def test_key_with_a_valid_prefix_but_wrong_secret_is_401(make_key):
    # given a real key whose secret part is altered
    key = make_key(Scope.INGEST)
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    # when it is used
    resp = client_for(forged).get("/api/v1/steps")
    # then 401
    assert_error(resp, 401, None)


@pytest.mark.parametrize("scope", [Scope.CONSUME, Scope.READ])
def test_key_without_the_ingest_scope_cannot_write(make_key, scope):
    # given a key that may consume or read but not ingest
    client = client_for(make_key(scope))
    before = pool_counts()
    # when it posts steps
    resp = post_raw(client, "/api/v1/steps", encode({"steps": [good_step()]}))
    # then 403 permission_error naming the scope, nothing written; it may still read
    err = assert_error(resp, 403, None)
    assert "ingest" in err["message"]
    assert pool_counts() == before
    assert client.get("/api/v1/steps").status_code == 200


def test_ingest_key_may_read(agent):
    # given an ingest-only key that wrote a step
    assert post_raw(agent, "/api/v1/steps", encode({"steps": [good_step()]})).status_code == 201
    # when it reads the step back
    resp = agent.get("/api/v1/steps/good-t-s0")
    # then it is allowed
    assert resp.status_code == 200 and resp.json()["uid"] == "good-t-s0"


# --- other write endpoints ------------------------------------------------------------------
@pytest.fixture
def seeded(db, agent_key) -> dict[str, str]:
    """One stored step in a running trajectory of a group, the agent's (its key's source: a
    key writes only into its own source's data); returns their uids."""
    source = Source.objects.get(name="agent").id
    steps_ingest(
        steps=[step_in("seed-t", 0, prompt=[1, 2, 3], response=[4, 5], group="seed-g")], source_id=source
    )
    return {"step": "seed-t:0", "trajectory": "seed-t", "group": "seed-g"}


S, T = "seed-t:0", "seed-t"

OTHER_CASES = [
    # rewards
    ("rewards", {"step_uid": S, "reward": 1.0, "bogus": 1}, None, 400, "rewards[0].bogus"),
    ("rewards", {"rewards": [{"step_uid": S, "reward": 1.0}], "extra": 1}, None, 400, "extra"),
    ("rewards", {"step_uid": S, "reward": RAW}, "NaN", 400, "rewards[0].reward"),
    ("rewards", {"step_uid": S, "reward": RAW}, "Infinity", 400, "rewards[0].reward"),
    ("rewards", {"step_uid": S, "reward": RAW}, "-Infinity", 400, "rewards[0].reward"),
    ("rewards", {"step_uid": S, "reward": RAW}, "1e999", 400, "rewards[0].reward"),
    ("rewards", {"step_uid": S, "reward": "1"}, None, 400, "rewards[0].reward"),
    ("rewards", {"step_uid": S, "reward": True}, None, 400, "rewards[0].reward"),
    ("rewards", {"step_uid": S}, None, 400, "rewards[0].reward"),
    ("rewards", {"reward": 1.0}, None, 400, "rewards[0].step_uid"),
    ("rewards", {"step_uid": S, "trajectory_uid": T, "reward": 1.0}, None, 400, "rewards[0].step_uid"),
    ("rewards", {"step_uid": S, "reward": 1.0, "source": "oracle"}, None, 400, "rewards[0].source"),
    ("rewards", {"step_uid": S, "reward": 1.0, "final": "yes"}, None, 400, "rewards[0].final"),
    ("rewards", {"step_uid": S, "reward": 1.0, "metadata": {"x": RAW}}, "NaN", 400, "rewards[0].metadata.x"),
    ("rewards", {"rewards": []}, None, 400, "rewards"),
    ("rewards", {"step_uid": "nope", "reward": 1.0}, None, 404, "rewards[0].step_uid"),
    ("rewards", {"trajectory_uid": "nope", "reward": 1.0}, None, 404, "rewards[0].trajectory_uid"),
    (
        "rewards",
        {"rewards": [{"step_uid": S, "reward": 1.0}, {"step_uid": "nope", "reward": 2.0}]},
        None,
        404,
        "rewards[1].step_uid",
    ),
    # events
    ("events", {"type": "x", "bogus": 1}, None, 400, "events[0].bogus"),
    ("events", {"payload": {}}, None, 400, "events[0].type"),
    ("events", {"type": "x" * 65}, None, 400, "events[0].type"),
    ("events", {"type": "x", "payload": []}, None, 400, "events[0].payload"),
    ("events", {"type": "x", "payload": {"a": RAW}}, "NaN", 400, "events[0].payload.a"),
    ("events", {"type": "x", "payload": {"a": [1, RAW]}}, "Infinity", 400, "events[0].payload.a[1]"),
    ("events", {"type": "x", "payload": {"a": "nul\u0000"}}, None, 400, "events[0].payload.a"),
    # (a NaN elsewhere makes the parser fall back to the stdlib, which keeps big ints exact)
    ("events", {"type": "x", "payload": {"a": RAW}}, f'{2**70}, "b": NaN', 400, "events[0].payload.a"),
    ("events", {"type": "x", "payload": {"a": 1e20}}, None, 400, "events[0].payload.a"),  # jsonb: int on read
    ("events", {"type": "x", "occurred_at": "yesterday"}, None, 400, "events[0].occurred_at"),
    ("events", {"events": []}, None, 400, "events"),
    ("events", {"type": "x", "trajectory_uid": "nope"}, None, 404, "events[0].trajectory_uid"),
    ("events", {"type": "x", "step_uid": "nope"}, None, 404, "events[0].step_uid"),
    (
        "events",
        {"events": [{"type": "ok", "step_uid": S}, {"type": "x", "step_uid": "nope"}]},
        None,
        404,
        "events[1].step_uid",
    ),
    # feedback
    ("feedback", {"step_uid": S, "bogus": 1}, None, 400, "bogus"),
    ("feedback", {"rating": 1.0}, None, 400, "step_uid"),
    ("feedback", {"step_uid": S, "trajectory_uid": T}, None, 400, "step_uid"),
    ("feedback", {"step_uid": S, "rating": RAW}, "NaN", 400, "rating"),
    ("feedback", {"step_uid": S, "rating": RAW}, "-Infinity", 400, "rating"),
    ("feedback", {"step_uid": S, "rating": "good"}, None, 400, "rating"),
    ("feedback", {"step_uid": S, "label": "x" * 65}, None, 400, "label"),
    ("feedback", {"step_uid": S, "comment": "nul\u0000"}, None, 400, "comment"),
    ("feedback", {"step_uid": "nope", "rating": 1.0}, None, 404, "step_uid"),
    ("feedback", {"trajectory_uid": "nope", "rating": 1.0}, None, 404, "trajectory_uid"),
    # policy versions
    ("policy-versions", {"version": 1, "bogus": 1}, None, 400, "bogus"),
    ("policy-versions", {}, None, 400, "version"),
    ("policy-versions", {"version": -1}, None, 400, "version"),
    ("policy-versions", {"version": "3"}, None, 400, "version"),
    ("policy-versions", {"version": 1.5}, None, 400, "version"),
    ("policy-versions", {"version": 2**63}, None, 400, "version"),
    ("policy-versions", {"version": 1, "current": "yes"}, None, 400, "current"),
    ("policy-versions", {"version": 1, "force": "yes"}, None, 400, "force"),
    ("policy-versions", {"version": 1, "force": 1}, None, 400, "force"),
    ("policy-versions", {"version": 1, "metadata": {"x": RAW}}, "NaN", 400, "metadata.x"),
    # trajectories
    ("trajectories", {"uid": "t-new", "bogus": 1}, None, 400, "bogus"),
    ("trajectories", {"uid": "t-new", "channel": "test"}, None, 400, "channel"),
    ("trajectories", {"uid": "t-new", "policy_version": 2**63}, None, 400, "policy_version"),
    ("trajectories", {"uid": "t-new", "policy_version": "1"}, None, 400, "policy_version"),
    ("trajectories", {"uid": "t-new", "metadata": []}, None, 400, "metadata"),
    ("trajectories", {"uid": "t-new", "metadata": {"k": RAW}}, "NaN", 400, "metadata.k"),
    ("trajectories", {"uid": ""}, None, 400, "uid"),
    ("trajectories", {"uid": "t" * 129}, None, 400, "uid"),
    ("trajectories/seed-t/complete", {"bogus": 1}, None, 400, "bogus"),
    ("trajectories/seed-t/complete", {"reward": RAW}, "NaN", 400, "reward"),
    ("trajectories/seed-t/complete", {"reward": RAW}, "1e999", 400, "reward"),
    ("trajectories/seed-t/complete", {"status": "running"}, None, 400, "status"),
    ("trajectories/seed-t/complete", {"reward_source": "oracle"}, None, 400, "reward_source"),
    ("trajectories/nope/complete", {"reward": 1.0}, None, 404, "uid"),
    # groups
    ("groups", {"uid": "g-new", "bogus": 1}, None, 400, "bogus"),
    ("groups", {"expected_rollouts": 2}, None, 400, "uid"),
    ("groups", {"uid": "g-new", "expected_rollouts": 0}, None, 400, "expected_rollouts"),
    ("groups", {"uid": "g-new", "expected_rollouts": 2**31}, None, 400, "expected_rollouts"),
    ("groups", {"uid": "g-new", "expected_rollouts": "4"}, None, 400, "expected_rollouts"),
    ("groups", {"uid": "g-new", "ground_truth": {"a": RAW}}, "NaN", 400, "ground_truth"),
    ("groups", {"uid": "seed-g", "expected_rollouts": 2**40}, None, 400, "expected_rollouts"),
]


@pytest.mark.parametrize(
    ("endpoint", "obj", "raw", "status", "param"),
    [pytest.param(*case, id=f"{case[0]}-{case[4]}-{i}") for i, case in enumerate(OTHER_CASES)],
)
def test_bad_input_on_other_endpoints(agent, trainer_key, seeded, endpoint, obj, raw, status, param):
    # given a stored step/trajectory/group and a bad body for a write endpoint (policy
    # versions: a trainer's, the policy scope)
    if endpoint == "policy-versions":
        agent = client_for(trainer_key)
    before = pool_counts()
    state = list(Trajectory.objects.values_list("uid", "status", "reward").order_by("uid"))
    step_state = list(Step.objects.values_list("uid", "reward", "reward_status").order_by("uid"))
    # when it is posted
    resp = post_raw(agent, f"/api/v1/{endpoint}", encode(obj, raw))
    # then the error names the field and nothing changed
    assert_error(resp, status, param)
    assert pool_counts() == before
    assert list(Trajectory.objects.values_list("uid", "status", "reward").order_by("uid")) == state
    assert list(Step.objects.values_list("uid", "reward", "reward_status").order_by("uid")) == step_state


@pytest.mark.parametrize(
    ("scope", "endpoint", "obj"),
    [
        (scope, endpoint, obj)
        for scope in (Scope.CONSUME, Scope.READ)
        for endpoint, obj in [
            ("rewards", {"step_uid": S, "reward": 1.0}),
            ("events", {"type": "x"}),
            ("feedback", {"step_uid": S}),
            ("policy-versions", {"version": 3}),
            ("trajectories", {"uid": "t-new"}),
            ("trajectories/seed-t/complete", {}),
            ("groups", {"uid": "g-new"}),
        ]
        # policy versions need the policy scope, which neither consume nor read implies
    ],
)
def test_other_writes_need_the_ingest_scope(seeded, scope, endpoint, obj):
    # given a key without the ingest scope
    client = client_for(api_key_create(name=f"k-{scope}", scopes=[scope])[1])
    before = pool_counts()
    # when it writes
    resp = post_raw(client, f"/api/v1/{endpoint}", encode(obj))
    # then 403, nothing written
    assert_error(resp, 403, None)
    assert pool_counts() == before
    assert Trajectory.objects.get(uid=T).status == Trajectory.Status.RUNNING
