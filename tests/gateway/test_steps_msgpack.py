"""POST /api/v1/steps in MessagePack: packed token arrays, same validation and round trip."""

from __future__ import annotations

import random

import msgspec
import numpy as np
import pytest

from claw_client import MSGPACK, encode_step_batch
from pool.models import Step, Trajectory
from tests.conftest import make_step

pytestmark = pytest.mark.django_db


def post_msgpack(client, body: bytes):
    return client.generic("POST", "/api/v1/steps", body, content_type=MSGPACK)


def test_packed_steps_round_trip_exactly(agent):
    # given steps with packed int32 ids and float64 logprobs, one with plain lists
    rng = random.Random(3)
    steps = [
        make_step(
            "mp",
            i,
            prompt=[rng.randrange(2**31) for _ in range(300)],
            response=[rng.randrange(2**31) for _ in range(20)],
            rollout_logprobs=[-rng.random() for _ in range(20)],
            reward=0.5,
            metadata={"k": [1, "x"]},
        )
        for i in range(3)
    ]
    body = encode_step_batch(steps[:2])
    plain = msgspec.msgpack.encode({"steps": [steps[2]]})
    # when posted as MessagePack
    assert post_msgpack(agent, body).status_code == 201
    assert post_msgpack(agent, plain).status_code == 201
    # then reads (JSON) give back exactly what was written, and a resubmission is a duplicate
    for st in steps:
        got = agent.get(f"/api/v1/steps/{st['uid']}").json()
        for key, value in st.items():
            assert got[key] == value, key
    again = post_msgpack(agent, body)
    assert again.status_code == 200 and again.json()["duplicates"] == 2


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("prompt_ids", b"\x01\x00\x00", "steps[0].prompt_ids"),  # not a multiple of 4 bytes
        ("prompt_ids", np.array([1, -5], dtype="<i4").tobytes(), "steps[0].prompt_ids[1]"),
        ("prompt_ids", np.array([1, 2**31], dtype="<u4").tobytes(), "steps[0].prompt_ids[1]"),
        ("response_ids", "abc", "steps[0].response_ids"),
        ("rollout_logprobs", b"\x00" * 7, "steps[0].rollout_logprobs"),
        ("rollout_logprobs", np.array([np.nan], dtype="<f8").tobytes(), "steps[0].rollout_logprobs[0]"),
        ("extra", 1, "steps[0].extra"),
    ],
)
def test_bad_packed_input_names_the_field(agent, field, value, param):
    # given a step with one bad packed field
    step = make_step("bad", 0, prompt=[1, 2], response=[3])
    step[field] = value
    # when posted
    resp = post_msgpack(agent, msgspec.msgpack.encode({"steps": [step]}))
    # then 400 names it and nothing is written
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == param
    assert not Step.objects.exists() and not Trajectory.objects.exists()


def test_malformed_msgpack_is_a_parse_error(agent):
    resp = post_msgpack(agent, b"\xc1\xc1\xc1")
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "parse_error"
