"""Decoding of step batches: the step contract's structs (pool/ingest/contract.py) in C.

Token arrays are large (a W-ingest batch holds 140,000 numbers), so nothing here touches
them one by one in Python. ``msgspec`` decodes the body straight into the contract's typed
structs: types (a JSON ``true`` is not a token id, ``3.0`` is not an integer), ranges (ids in
[0, 2**31)), unknown fields and missing fields are all checked while parsing, with the exact
path of the first error (``$.steps[3].prompt_ids[17]``), at the speed of orjson.loads alone.
``contract.steps_from_wire`` then applies the rules a schema cannot state, per step.

Errors raise InvalidInput naming the field (``steps[3].prompt_ids[17]``); malformed JSON
raises a ParseError.
"""

from __future__ import annotations

from typing import Any

import msgspec
from django.conf import settings
from rest_framework.exceptions import ParseError

from claw_kit.web import body
from pool.errors import InvalidInput
from pool.ingest.contract import (
    JsonStepBatchWire,
    PackedStepBatchWire,
    StepBatchWire,
    StepIn,
    steps_from_wire,
    wire_invalid,
)

# Token id arrays stay raw JSON text until contract._ids parses them into arrays.
_decoder = msgspec.json.Decoder(JsonStepBatchWire)
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
    except RecursionError:
        raise _too_deep() from None
    return steps_from_wire(batch)


def _too_deep() -> ParseError:
    return ParseError(f"the body is nested deeper than {settings.CLAW_MAX_JSON_DEPTH} levels")


def _require_json(raw: bytes) -> Any:
    """Parse leniently: non-standard NaN/Infinity literals (and 1e999) are not JSON, but are
    accepted here so the field validator can name the field holding them."""
    try:
        return body.loads(raw)
    except body.BodyError as exc:
        raise ParseError(exc.message) from None


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
    except RecursionError:
        raise _too_deep() from None
    return steps_from_wire(batch)


def parse_step_batch(parsed: Any) -> list[StepIn]:
    """Validate an already-parsed body (used by the Claw-R1 compatibility layer)."""
    try:
        batch = msgspec.convert(parsed, StepBatchWire)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except RecursionError:
        raise _too_deep() from None
    return steps_from_wire(batch)


def _invalid(exc: msgspec.ValidationError) -> InvalidInput:
    """msgspec's error about the body, naming its field (contract.wire_invalid)."""
    return wire_invalid(exc, default="steps")
