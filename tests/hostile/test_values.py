"""Values a door must refuse though they parse: a positive (or non-finite) logprob, a reward
or rating beyond its bound, an identifier holding a bidi control or a zero-width character,
a dataset named after a route. One table over the doors: each a 4xx JSON error naming the
field, and nothing written."""

from __future__ import annotations

import json
import struct

import msgspec
import pytest
from django.test import Client

from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.models import Scope
from pool.services.api_keys import api_key_create
from tests.hostile.test_walk import every_count
from tests.pool.factories import step_in

# transaction=True: the Claw-R1 doors write on the gateway's own database threads
pytestmark = pytest.mark.django_db(transaction=True)

A = "/api/v1"


def step(**extra) -> dict:
    return {"trajectory_uid": "val-t", "step_index": 0, "prompt_ids": [1, 2], "response_ids": [3], **extra}


def packed_step(**extra) -> dict:
    return {**step(), "response_ids": struct.pack("<i", 3), **extra}


def j(body) -> tuple[bytes, str]:
    return json.dumps(body).encode(), "application/json"


def mp(body) -> tuple[bytes, str]:
    return msgspec.msgpack.encode(body), "application/msgpack"


# (case, path ("{key}": the caller's key), body, the field the error names)
CASES = [
    # --- logprobs: at most 0, finite ---------------------------------------------------------------
    (
        "steps JSON: a logprob of +5.0",
        f"{A}/steps",
        j({"steps": [step(rollout_logprobs=[5.0])]}),
        "steps[0].rollout_logprobs[0]",
    ),
    (
        "steps JSON: a logprob of +1e-9",
        f"{A}/steps",
        j({"steps": [step(rollout_logprobs=[1e-9])]}),
        "steps[0].rollout_logprobs[0]",
    ),
    (
        "steps MessagePack: a logprob of +5.0",
        f"{A}/steps",
        mp({"steps": [step(rollout_logprobs=[5.0])]}),
        "steps[0].rollout_logprobs[0]",
    ),
    (
        "steps MessagePack: a packed logprob of +0.5",
        f"{A}/steps",
        mp({"steps": [packed_step(rollout_logprobs=struct.pack("<d", 0.5))]}),
        "steps[0].rollout_logprobs[0]",
    ),
    (
        "Claw-R1 submit_steps: a logprob of +5.0",
        "/compat/claw-r1/k/{key}/submit_steps",
        j({"steps": [step(rollout_log_probs=[5.0])]}),
        "steps[0].rollout_log_probs[0]",
    ),
    # --- rewards: finite and within CLAW_REWARD_ABS_MAX --------------------------------------------
    ("steps: a reward of 1e308", f"{A}/steps", j({"steps": [step(reward=1e308)]}), "steps[0].reward"),
    (
        "steps: a reward of -1e6 - 1",
        f"{A}/steps",
        j({"steps": [step(reward=-1_000_001.0)]}),
        "steps[0].reward",
    ),
    (
        "steps: a token reward of 1e7",
        f"{A}/steps",
        j({"steps": [step(token_rewards=[1e7])]}),
        "steps[0].token_rewards[0]",
    ),
    (
        "Claw-R1 submit_steps: a reward of 1e308",
        "/compat/claw-r1/k/{key}/submit_steps",
        j({"steps": [step(reward=1e308)]}),
        "steps[0].reward",
    ),
    (
        "rewards: a reward of 1e308",
        f"{A}/rewards",
        j({"step_uid": "val-seed:0", "reward": 1e308}),
        "rewards[0].reward",
    ),
    (
        "trajectory complete: a reward of 1e7",
        f"{A}/trajectories/val-seed/complete",
        j({"reward": 1e7}),
        "reward",
    ),
    (
        "trajectory-completions: a reward of -1e308",
        f"{A}/trajectory-completions",
        j({"completions": [{"uid": "val-seed", "reward": -1e308}]}),
        "completions[0].reward",
    ),
    # --- ratings ------------------------------------------------------------------------------------
    (
        "feedback: a rating of 1e308",
        f"{A}/feedback",
        j({"step_uid": "val-seed:0", "rating": 1e308}),
        "rating",
    ),
    ("feedback: a rating of -2e6", f"{A}/feedback", j({"step_uid": "val-seed:0", "rating": -2e6}), "rating"),
    # --- identifiers: no bidi controls, no zero-width characters -----------------------------------
    (
        "steps: a trajectory uid with U+202E",
        f"{A}/steps",
        j({"steps": [step(trajectory_uid="val\u202eevil")]}),
        "steps[0].trajectory_uid",
    ),
    ("steps: a step uid with U+200B", f"{A}/steps", j({"steps": [step(uid="val\u200bs")]}), "steps[0].uid"),
    (
        "steps: a group uid with U+2028",
        f"{A}/steps",
        j({"steps": [step(prompt_group_uid="g\u2028x")]}),
        "steps[0].prompt_group_uid",
    ),
    ("trajectories: a uid with U+2066", f"{A}/trajectories", j({"uid": "val\u2066t"}), "uid"),
    ("trajectories: a uid with U+FEFF", f"{A}/trajectories", j({"uid": "\ufeffval-t"}), "uid"),
    ("groups: a uid with U+200D", f"{A}/groups", j({"uid": "val\u200dg"}), "uid"),
    (
        "Claw-R1 submit_steps: a trajectory uid with U+202E",
        "/compat/claw-r1/k/{key}/submit_steps",
        j({"steps": [step(trajectory_uid="val\u202et")]}),
        "steps[0].trajectory_uid",
    ),
    # --- reserved dataset names ----------------------------------------------------------------------
    ("datasets: the name 'preview'", f"{A}/datasets", j({"name": "preview"}), "name"),
]


@pytest.fixture
def caller() -> tuple[Client, str]:
    steps_ingest(steps=[step_in("val-seed", 0, prompt=[1, 2], response=[3])])
    dataset_create(name="val-ds")
    key = api_key_create(name="val-admin", scopes=[Scope.ADMIN])[1]
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}"), key


@pytest.mark.parametrize(("case", "path", "body", "param"), CASES, ids=[c[0] for c in CASES])
def test_a_value_beyond_its_rule_is_a_4xx_naming_the_field(caller, case, path, body, param):
    client, key = caller
    before = every_count()
    data, content_type = body
    # when the request is sent
    resp = client.post(path.format(key=key), data=data, content_type=content_type)
    # then a 4xx naming the field, and nothing written
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:300])
    error = resp.json()["error"]
    assert error["param"] == param, error
    assert error["message"]
    assert every_count() == before


# The same doors with the value at its bound: taken (what is refused above is the value).
ACCEPTED = [
    (
        "a logprob of 0.0 and one of -50",
        f"{A}/steps",
        j({"steps": [step(uid="ok-1", rollout_logprobs=[0.0])]}),
    ),
    (
        "a reward of exactly 1e6",
        f"{A}/steps",
        j({"steps": [step(uid="ok-2", trajectory_uid="ok-t2", reward=1e6)]}),
    ),
    ("a reward of -1e6", f"{A}/rewards", j({"step_uid": "val-seed:0", "reward": -1e6})),
    ("a rating of 1e6", f"{A}/feedback", j({"step_uid": "val-seed:0", "rating": 1e6})),
    ("a non-ASCII uid", f"{A}/trajectories", j({"uid": "val-é漢🙂"})),
    ("a dataset named 'previews'", f"{A}/datasets", j({"name": "previews"})),
]


@pytest.mark.parametrize(("case", "path", "body"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_the_value_at_its_bound_is_taken(caller, case, path, body):
    client, key = caller
    data, content_type = body
    resp = client.post(path.format(key=key), data=data, content_type=content_type)
    assert 200 <= resp.status_code < 300, (resp.status_code, resp.content[:300])


def test_the_reserved_dataset_names_are_the_datasets_apis_literal_routes():
    from django.urls import URLPattern, URLResolver, get_resolver

    from curation.services.datasets import RESERVED_NAMES

    literal: set[str] = set()

    def walk(patterns, prefix: str) -> None:
        for p in patterns:
            if isinstance(p, URLResolver):
                walk(p.url_patterns, prefix + str(p.pattern))
            elif isinstance(p, URLPattern):
                route = prefix + str(p.pattern)
                if route.startswith("api/v1/datasets/"):
                    segment = route.removeprefix("api/v1/datasets/").split("/")[0]
                    if "<" not in segment:
                        literal.add(segment)

    walk(get_resolver().url_patterns, "")
    assert literal == set(RESERVED_NAMES)


# A trajectory uid holding U+2028 (or a C1 control) in the header that names it: refused before
# anything is stored or sent upstream (the uid is echoed in the answer's header, which could not
# carry it: the client saw a dropped connection, and each retry stored another step).
HEADER_UIDS = [
    ("U+2028 as UTF-8", "a\u2028b".encode().decode("latin-1")),
    ("U+202E as UTF-8", "a\u202eb".encode().decode("latin-1")),
    ("a C1 control", "a\x85b"),
]


@pytest.mark.parametrize(("case", "uid"), HEADER_UIDS, ids=[c for c, _ in HEADER_UIDS])
def test_a_trajectory_header_with_a_separator_is_refused_before_anything_is_stored(caller, case, uid):
    client, _ = caller
    before = every_count()
    body = {"model": "claw-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for _attempt in range(2):  # a retry stores nothing either
        resp = client.post(
            "/v1/chat/completions",
            data=json.dumps(body),
            content_type="application/json",
            HTTP_X_CLAW_TRAJECTORY=uid,
        )
        assert resp.status_code == 400, resp.content[:300]
        assert resp.json()["error"]["code"] == "invalid_uid"
        assert "x-claw-trajectory" not in {k.lower() for k in resp.headers}
    assert every_count() == before


# A reward function's score (compute_reward, the reward tasks): within CLAW_REWARD_ABS_MAX too.
SCORES = [(1e308, False), (-2e6, False), (1e6, True), (-0.5, True)]


@pytest.mark.parametrize(("score", "taken"), SCORES, ids=[f"{s:g}" for s, _ in SCORES])
def test_a_reward_functions_score_is_within_the_bound(score, taken, settings):
    from pool.rewards.base import RewardError, as_result

    settings.CLAW_REWARD_ABS_MAX = 1e6
    if taken:
        assert as_result(score).score == score
    else:
        with pytest.raises(RewardError, match="CLAW_REWARD_ABS_MAX"):
            as_result(score)
