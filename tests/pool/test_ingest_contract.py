"""The step contract (pool/ingest/contract.py): the wire struct is the source; StepIn, the
read shape, the OpenAPI serializer and the idempotency fingerprint follow it."""

from __future__ import annotations

import types
import typing

import msgspec
import numpy as np
import pytest

from gateway import serializers as s
from pool.ingest.contract import (
    CONTENT_FIELDS,
    READ_FIELDS,
    REQUIRED_FIELDS,
    STEP_FIELDS,
    StepIn,
    StepWire,
)
from pool.ingest.media import ImageIn
from pool.ingest.pipeline import steps_ingest
from pool.ingest.plan import pack
from pool.models import Step
from pool.selectors.steps import steps_render
from tests.pool.factories import step_in

# How each wire type is held once validated (arrays become numpy).
_HELD_AS = {int: int, float: float, bool: bool, str: str, list: list, dict: dict}


def _base(tp: typing.Any) -> tuple[type, bool]:
    """(the runtime type, optional?) of a struct or dataclass annotation."""
    optional = False
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = optional or len(args) < len(typing.get_args(tp))
            tp = args[0]
        elif origin is typing.Literal:
            return str, optional
        elif origin is not None:
            return origin, optional
        else:
            return tp, optional


def test_stepin_holds_every_wire_field_with_its_type():
    wire = typing.get_type_hints(StepWire, include_extras=True)
    held = typing.get_type_hints(StepIn)
    assert set(STEP_FIELDS) <= set(held), set(STEP_FIELDS) - set(held)
    for name in STEP_FIELDS:
        wire_type, wire_optional = _base(wire[name])
        held_type, held_optional = _base(held[name])
        if name in ("prompt_ids", "response_ids", "rollout_logprobs", "token_rewards"):
            assert held_type is np.ndarray, name
        elif name in ("uid", "metadata"):  # defaulted by the contract (uid from the index, {})
            assert held_type is _HELD_AS[wire_type], name
        else:
            assert held_type is _HELD_AS[wire_type], (name, wire_type, held_type)
            assert held_optional == wire_optional, name
    # and StepIn adds only what the pool or the door sets, never a client
    assert set(held) - set(STEP_FIELDS) == {
        "token_source",
        "drift",
        "drift_offset",
        "branch",
        "parent_step_id",
        "field_prefix",
        "row_id",
        "images",  # the decoded images: from multi_modal_data, or set by a proxied door
    }


@pytest.mark.django_db
def test_reads_return_exactly_the_read_fields():
    steps_ingest(steps=[step_in("doc", 0, prompt=[1, 2], response=[3])])
    rendered = steps_render(list(Step.objects.with_context()))[0]
    assert tuple(rendered) == READ_FIELDS


def test_the_openapi_serializer_is_derived_from_the_struct():
    fields = s.StepWriteSerializer().fields
    assert tuple(fields) == STEP_FIELDS
    assert {n for n, f in fields.items() if f.required} == REQUIRED_FIELDS
    info = {f.name: f for f in msgspec.inspect.type_info(StepWire).fields}
    for name, field in fields.items():
        tp = info[name].type.type  # under the description's Metadata
        nullable = isinstance(tp, msgspec.inspect.UnionType) and any(
            isinstance(t, msgspec.inspect.NoneType) for t in tp.types
        )
        assert field.allow_null == nullable, name
    assert fields["step_index"].max_value == 2**31 - 1 and fields["uid"].max_length == 160
    assert set(fields["reward_source"].choices) == {"env", "rule", "model", "human"}


def test_the_fingerprint_covers_every_content_field_and_not_the_uid():
    base = step_in("t", 2, prompt=[1, 2, 3], response=[4, 5], group="g", metadata={"k": 1})
    h = pack(base).content_hash
    assert (
        pack(
            step_in("t", 2, prompt=[1, 2, 3], response=[4, 5], group="g", metadata={"k": 1}, uid="x")
        ).content_hash
        == h
    )
    changed = {
        "trajectory_uid": "t2", "prompt_group_uid": "g2", "step_index": 3, "reward": 1.0, "reward_source": "rule",
        "policy_version": 1, "is_last": True, "finish_reason": "stop", "messages": [{"role": "user"}],
        "response_text": "x", "metadata": {"k": 2}, "token_source": "upstream",
    }  # fmt: skip
    assert set(changed) | {"prompt_ids", "response_ids"} == set(CONTENT_FIELDS)
    for name, value in changed.items():
        other = step_in("t", 2, prompt=[1, 2, 3], response=[4, 5], group="g", metadata={"k": 1})
        setattr(other, name, value)
        assert pack(other).content_hash != h, name
    # images enter by content (sha256) and place, and only when a step has any
    with_image = step_in("t", 2, prompt=[1, 2, 3], response=[4, 5], group="g", metadata={"k": 1})
    with_image.images = [ImageIn(field="i", sha256="a" * 64)]
    other_image = step_in("t", 2, prompt=[1, 2, 3], response=[4, 5], group="g", metadata={"k": 1})
    other_image.images = [ImageIn(field="i", sha256="b" * 64)]
    assert len({h, pack(with_image).content_hash, pack(other_image).content_hash}) == 3
    for prompt, response in (([1, 2, 3, 4], [5]), ([1, 2, 3], [4, 6])):
        assert (
            pack(step_in("t", 2, prompt=prompt, response=response, group="g", metadata={"k": 1})).content_hash
            != h
        )


def test_fingerprints_of_stored_steps_are_unchanged():
    # Pinned from the fingerprint of the previous release: resubmitting a step stored before
    # the pipeline must still be a duplicate, not a 409.
    full = StepIn(
        uid="u", trajectory_uid="t", step_index=2, prompt_ids=np.array([1, 2, 3], dtype=np.int32),
        response_ids=np.array([4, 5], dtype=np.int32), prompt_group_uid="g",
        rollout_logprobs=np.array([-0.5, -1.25]), reward=1.0, reward_source="rule", policy_version=7, is_last=True,
        finish_reason="stop", messages=[{"role": "user", "content": "hi"}], response_text="ok",
        metadata={"k": [1, 2]},
    )  # fmt: skip
    bare = StepIn(
        uid="u", trajectory_uid="t", step_index=0, prompt_ids=np.array([1], dtype=np.int32),
        response_ids=np.zeros(0, dtype=np.int32),
    )  # fmt: skip
    assert pack(full).content_hash.hex() == "28257c5c3285050faad527cd57b8465e"
    assert pack(bare).content_hash.hex() == "6432b027270bc0a591ba761eacd8f44d"
