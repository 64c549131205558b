"""Validation of step batches: typed decoding in C, then a few vectorised checks.

Token arrays are large (a W-ingest batch holds 140,000 numbers), so nothing here touches
them one by one in Python. ``msgspec`` decodes the JSON body straight into typed structs:
types (a JSON ``true`` is not a token id, ``3.0`` is not an integer), ranges (ids in
[0, 2**31)), unknown fields and missing fields are all checked while parsing, with the exact
path of the first error (``$.steps[3].prompt_ids[17]``), at the speed of orjson.loads alone.
The lists then become int32/float64 numpy arrays with ``array('I')``/``array('d')`` (C loops),
and the remaining rules (lengths, finiteness, storable JSON) run per step, not per token.

Errors raise InvalidInput naming the field (``steps[3].prompt_ids[17]``); malformed JSON
raises a ParseError.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from django.conf import settings
from rest_framework.exceptions import ParseError

from pool import tokens
from pool.errors import InvalidInput
from pool.services import StepIn

assert array("I").itemsize == 4, "token conversion assumes a 32-bit C unsigned int"

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_UID_LEN = 128

TokenId = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Index = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]  # Step.step_index is a 32-bit column
Uid = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_UID_LEN)]


def _step_wire(name: str, token_ids: Any, logprobs: Any, doc: str) -> type[msgspec.Struct]:
    """A step struct; JSON and MessagePack differ only in how arrays may be encoded."""
    cls = msgspec.defstruct(
        name,
        [
            ("trajectory_uid", Uid),
            ("step_index", Index),
            ("prompt_ids", token_ids),
            ("response_ids", token_ids),
            ("uid", Uid | None, None),
            ("prompt_group_uid", Uid | None, None),
            ("rollout_logprobs", logprobs | None, None),
            ("reward", float | None, None),
            ("reward_source", Literal["env", "rule", "model", "human"] | None, None),
            ("policy_version", Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)] | None, None),
            ("is_last", bool, False),
            ("finish_reason", Annotated[str, msgspec.Meta(max_length=32)] | None, None),
            ("messages", list[dict[str, Any]] | None, None),
            ("response_text", str | None, None),
            ("metadata", dict[str, Any] | None, None),
        ],
        forbid_unknown_fields=True,
    )
    cls.__doc__ = doc
    return cls


def _batch_wire(name: str, step: type[msgspec.Struct]) -> type[msgspec.Struct]:
    return msgspec.defstruct(
        name,
        [("steps", Annotated[list[step], msgspec.Meta(min_length=1)])],
        forbid_unknown_fields=True,  # type: ignore[valid-type]
    )


StepWire = _step_wire(
    "StepWire",
    list[TokenId],
    list[float],
    "One step as submitted. The field names are the API's, for writes and reads.",
)
# MessagePack (``Content-Type: application/msgpack``): token ids may also be a bin of
# little-endian int32 and logprobs a bin of little-endian float64, so arrays cross the wire
# and the parser as raw buffers, never as per-id objects.
PackedStepWire = _step_wire(
    "PackedStepWire",
    list[TokenId] | bytes,
    list[float] | bytes,
    "A step in MessagePack, arrays possibly packed.",
)
StepBatchWire = _batch_wire("StepBatchWire", StepWire)
PackedStepBatchWire = _batch_wire("PackedStepBatchWire", PackedStepWire)

STEP_FIELDS = frozenset(StepWire.__struct_fields__)
_decoder = msgspec.json.Decoder(StepBatchWire)
_msgpack_decoder = msgspec.msgpack.Decoder(PackedStepBatchWire)


def parse_step_batch_json(raw: bytes) -> list[StepIn]:
    """Decode and validate a JSON body ``{"steps": [...]}``."""
    if not raw.strip():
        raise InvalidInput('empty body; expected {"steps": [...]}', field="steps")
    try:
        batch = _decoder.decode(raw)
    except msgspec.ValidationError as exc:
        # The decoder stops at the first schema error, possibly before a syntax error further
        # on: a body that is not JSON at all is reported as such (error path only).
        _require_json(raw)
        raise _invalid(exc) from None
    except msgspec.DecodeError:
        return parse_step_batch(_require_json(raw))
    return _to_steps(batch)


def _require_json(raw: bytes) -> Any:
    """Parse leniently: non-standard NaN/Infinity literals (and 1e999) are not JSON, but are
    accepted here so the field validator can name the field holding them."""
    try:
        return json.loads(raw, parse_constant=float)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ParseError(f"malformed JSON: {exc}") from None


def parse_step_batch_msgpack(raw: bytes) -> list[StepIn]:
    """Decode and validate a MessagePack body ``{"steps": [...]}`` (see PackedStepWire)."""
    if not raw:
        raise InvalidInput('empty body; expected {"steps": [...]}', field="steps")
    try:
        batch = _msgpack_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except msgspec.DecodeError as exc:
        raise ParseError(f"malformed MessagePack: {exc}") from None
    return _to_steps(batch)


def parse_step_batch(body: Any) -> list[StepIn]:
    """Validate an already-parsed body (used by the Claw-R1 compatibility layer)."""
    try:
        batch = msgspec.convert(body, StepBatchWire)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    return _to_steps(batch)


# --- conversion and the rules a schema cannot state ---------------------------------------------
def _to_steps(batch: Any) -> list[StepIn]:
    limit = settings.CLAW_MAX_STEPS_PER_BATCH
    if len(batch.steps) > limit:
        raise InvalidInput(f"a batch holds at most {limit} steps; got {len(batch.steps)}", field="steps")
    return [_to_step(s, f"steps[{i}]") for i, s in enumerate(batch.steps)]


def _to_step(w: Any, where: str) -> StepIn:
    prompt = _ids(w.prompt_ids, f"{where}.prompt_ids")
    response = _ids(w.response_ids, f"{where}.response_ids")
    if len(prompt) == 0:
        raise InvalidInput("prompt_ids must not be empty", field=f"{where}.prompt_ids")
    max_tokens = settings.CLAW_MAX_TOKENS_PER_STEP
    if len(prompt) + len(response) > max_tokens:
        field = "response_ids" if len(response) > max_tokens else "prompt_ids"
        raise InvalidInput(
            f"prompt_ids + response_ids hold {len(prompt) + len(response)} tokens; the limit is {max_tokens}",
            field=f"{where}.{field}",
        )
    logprobs: np.ndarray | None = None
    if isinstance(w.rollout_logprobs, bytes):
        if len(w.rollout_logprobs) % 8:
            raise InvalidInput(
                "packed logprobs must be little-endian float64 (8 bytes each)",
                field=f"{where}.rollout_logprobs",
            )
        logprobs = np.frombuffer(w.rollout_logprobs, dtype="<f8")
    elif w.rollout_logprobs is not None:
        logprobs = (
            np.frombuffer(array("d", w.rollout_logprobs), dtype=np.float64)
            if w.rollout_logprobs
            else np.zeros(0)
        )
    if logprobs is not None:
        if len(logprobs) != len(response):
            raise InvalidInput(
                f"rollout_logprobs has {len(logprobs)} values but response_ids has {len(response)} tokens",
                field=f"{where}.rollout_logprobs",
            )
        if len(logprobs) and not np.isfinite(logprobs).all():
            i = int(np.flatnonzero(~np.isfinite(logprobs))[0])
            raise InvalidInput("must be a finite number", field=f"{where}.rollout_logprobs[{i}]")
    if w.reward is not None and not math.isfinite(w.reward):
        raise InvalidInput("must be a finite number", field=f"{where}.reward")
    for name in ("trajectory_uid", "uid", "prompt_group_uid", "finish_reason", "response_text"):
        value = getattr(w, name)
        if value is not None and "\x00" in value:
            raise InvalidInput("must not contain NUL characters", field=f"{where}.{name}")
    if w.messages is not None:
        _check_json(w.messages, f"{where}.messages")
    metadata = w.metadata if w.metadata is not None else {}
    _check_json(metadata, f"{where}.metadata")
    return StepIn(
        uid=w.uid if w.uid is not None else f"{w.trajectory_uid}:{w.step_index}",
        trajectory_uid=w.trajectory_uid,
        prompt_group_uid=w.prompt_group_uid,
        step_index=w.step_index,
        prompt_ids=prompt,
        response_ids=response,
        rollout_logprobs=logprobs,
        reward=w.reward,
        reward_source=w.reward_source,
        policy_version=w.policy_version,
        is_last=w.is_last,
        finish_reason=w.finish_reason,
        messages=w.messages,
        response_text=w.response_text,
        metadata=metadata,
        field_prefix=where,
    )


def _ids(values: list[int] | bytes, where: str) -> np.ndarray:
    if isinstance(values, bytes):  # packed little-endian int32 (MessagePack bodies)
        if len(values) % 4:
            raise InvalidInput("packed token ids must be little-endian int32 (4 bytes each)", field=where)
        arr = np.frombuffer(values, dtype=tokens.TOKEN_DTYPE)
        if len(arr) and int(arr.min()) < 0:
            i = int(np.flatnonzero(arr < 0)[0])
            raise InvalidInput("token ids must be in [0, 2**31)", field=f"{where}[{i}]")
        return arr
    # Ranges are already checked by the decoder; array('I') is the fastest C conversion.
    return np.frombuffer(array("I", values), dtype=np.int32) if values else tokens.EMPTY_IDS


def json_problem(value: Any, path: str = "") -> tuple[str, str] | None:
    """The first value a JSON column cannot store or the renderer cannot write back, as
    (path inside ``value``, reason), or None: the one rule for every JSON field (step
    metadata and messages here, payloads and metadata in gateway.serializers).

    The parser accepts NaN/Infinity (so validators can name the field); PostgreSQL's jsonb
    rejects them and NUL characters; jsonb returns an integral float as an integer, and
    orjson renders integers only within 64 bits."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, dict):
            items = []
            for k, item in v.items():
                sub = f"{at}.{k}" if at else str(k)
                if "\x00" in str(k):
                    return (sub, "keys must not contain NUL characters")
                items.append((item, sub))
            stack.extend(reversed(items))
        elif isinstance(v, list):
            stack.extend(reversed([(item, f"{at}[{i}]") for i, item in enumerate(v)]))
        elif isinstance(v, str):
            if "\x00" in v:
                return (at, "must not contain NUL characters")
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not -INT64_MAX - 1 <= v <= INT64_MAX:
                return (at, "integers must fit in 64 bits")
        elif isinstance(v, float):
            if not math.isfinite(v):
                return (at, "must be a finite number")
            if abs(v) >= 2.0**63 and v == int(v):
                return (at, "integral numbers must lie within 64 bits to be stored exactly")
    return None


def _check_json(value: Any, where: str) -> None:
    found = json_problem(value, where)
    if found:
        raise InvalidInput(found[1], field=found[0])


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD = re.compile(r"(?:missing required field|contains unknown field) `(?P<name>[^`]+)`")


def _invalid(exc: msgspec.ValidationError) -> InvalidInput:
    """msgspec's message (``Expected `int`, got `str` - at `$.steps[1].step_index` ``) as an
    InvalidInput naming ``steps[1].step_index``."""
    m = _AT.match(str(exc))
    message = m.group("msg") if m else str(exc)
    path = (m.group("path") or "") if m else ""
    path = path[1:] if path.startswith(".") else path
    named = _FIELD.search(message)
    if named:
        path = f"{path}.{named.group('name')}" if path else named.group("name")
    return InvalidInput(message, field=path or "steps")
