"""The step contract: what a step is on the wire, in one definition.

``StepWire`` (a msgspec struct) is the source. From it derive:

* the JSON and MessagePack decoders of gateway/validation.py (types, ranges, unknown and
  missing fields are checked in C while parsing, with the exact path of the first error);
* the OpenAPI schema of the write and read shapes (gateway/serializers.py builds the
  serializers from the struct's type info);
* ``READ_FIELDS``, the keys a read returns (pool.selectors.steps_render);
* ``CONTENT_FIELDS``, what the idempotency fingerprint covers (pool/ingest/plan.py).

``StepIn`` is the same step once validated: token ids as int32 arrays, logprobs as float64,
the uid defaulted. It cannot be derived from the struct (its arrays are numpy), so a test
pins it to the struct field by field, types included (tests/pool/test_ingest_contract.py).
"""

from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec
import numpy as np

from .. import tokens
from ..errors import InvalidInput
from ..models import Step
from . import rules
from .media import ImageIn, images_from_multi_modal_data

assert array("I").itemsize == 4, "token conversion assumes a 32-bit C unsigned int"

TokenId = Annotated[int, msgspec.Meta(ge=0, le=rules.INT32_MAX)]
Index = Annotated[int, msgspec.Meta(ge=0, le=rules.INT32_MAX)]  # Step.step_index is a 32-bit column
Uid = Annotated[str, msgspec.Meta(min_length=1, max_length=rules.MAX_UID_LEN)]
# A step's uid may be as long as its column (the default "<trajectory_uid>:<step_index>" fits).
StepUid = Annotated[str, msgspec.Meta(min_length=1, max_length=rules.MAX_STEP_UID_LEN)]
RewardSource = Literal["env", "rule", "model", "human"]
PolicyVersion = Annotated[int, msgspec.Meta(ge=0, le=rules.INT64_MAX)]
FinishReason = Annotated[str, msgspec.Meta(max_length=rules.MAX_FINISH_REASON_LEN)]
# One run of token_policy_versions: [version, count] (the count's lower bound, 1, is checked
# by step_from_wire: a list type has one bound for both).
VersionRun = Annotated[list[PolicyVersion], msgspec.Meta(min_length=2, max_length=2)]


def _doc(tp: Any, text: str) -> Any:
    return Annotated[tp, msgspec.Meta(description=text)]


def _step_wire(name: str, token_ids: Any, logprobs: Any, doc: str) -> type[msgspec.Struct]:
    """A step struct; JSON and MessagePack differ only in how arrays may be encoded."""
    cls = msgspec.defstruct(
        name,
        [
            ("trajectory_uid", _doc(Uid, "The episode this step belongs to; created on first sight.")),
            ("prompt_group_uid", _doc(Uid | None, "The prompt group (GRPO group) of the trajectory."), None),
            ("step_index", _doc(Index, "Position of the step in its trajectory (0-based).")),
            ("prompt_ids", _doc(token_ids, "State: the exact token ids the model saw.")),
            ("response_ids", _doc(token_ids, "Action: the exact token ids the model produced.")),
            ("uid", _doc(StepUid | None, "Idempotency key. Default: '<trajectory_uid>:<step_index>'."), None),
            ("rollout_logprobs", _doc(logprobs | None, "One logprob per response id, as sampled."), None),
            (
                "token_rewards",
                _doc(
                    logprobs | None, "Token-level rewards: one finite float per response id (dense shaping)."
                ),
                None,
            ),
            (
                "token_policy_versions",
                _doc(
                    list[VersionRun] | None,
                    "The policy version of each response id, run-length encoded: [[version, count], ...], "
                    "counts summing to the length of response_ids (a partial rollout spans versions).",
                ),
                None,
            ),
            ("reward", _doc(float | None, "A final reward, if known at submission."), None),
            ("reward_source", _doc(RewardSource | None, "Who gave the reward (default env)."), None),
            ("policy_version", _doc(PolicyVersion | None, "The policy version that generated it."), None),
            ("is_last", _doc(bool, "The last step: completes the trajectory."), False),
            ("finish_reason", _doc(FinishReason | None, "Why generation stopped (stop, length...)."), None),
            ("messages", _doc(list[dict[str, Any]] | None, "The chat messages of the prompt, if any."), None),
            ("response_text", _doc(str | None, "The response as text, if known."), None),
            ("metadata", _doc(dict[str, Any] | None, "Free-form JSON object."), None),
            (
                "multi_modal_data",
                _doc(
                    dict[str, Any] | None,
                    'Claw-R1\'s multi-modal data: {"images": [...]}, each image base64 (or a data: URL) or '
                    '{"sha256": ...} of an uploaded image (POST /api/v1/media), in prompt order. '
                    "Stored once by content; a read returns the images as references.",
                ),
                None,
            ),
        ],
        forbid_unknown_fields=True,
        kw_only=True,  # field order is free: it is the fingerprint's order (CONTENT_FIELDS)
    )
    cls.__doc__ = doc
    return cls


def _batch_wire(name: str, step: type[msgspec.Struct]) -> type[msgspec.Struct]:
    return msgspec.defstruct(
        name,
        [("steps", Annotated[list[step], msgspec.Meta(min_length=1)])],  # type: ignore[valid-type]
        forbid_unknown_fields=True,
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
# JSON bodies as decoded (gateway/validation.py): the token id arrays are kept as their raw
# JSON text, which msgspec has checked to be well-formed JSON while skipping over it, and are
# parsed straight into int32 arrays by ``_ids`` (never one Python int per id); any array
# that is not plainly non-negative integers takes the typed decode, which names the element.
# StepWire stays the contract (the schema, ``msgspec.convert`` of parsed bodies).
JsonStepWire = _step_wire(
    "JsonStepWire", msgspec.Raw, list[float], "A step in JSON, its token id arrays as raw JSON text."
)
StepBatchWire = _batch_wire("StepBatchWire", StepWire)
JsonStepBatchWire = _batch_wire("JsonStepBatchWire", JsonStepWire)
PackedStepBatchWire = _batch_wire("PackedStepBatchWire", PackedStepWire)

# --- shapes derived from the struct ------------------------------------------------------------
STEP_FIELDS: tuple[str, ...] = StepWire.__struct_fields__
REQUIRED_FIELDS: frozenset[str] = frozenset(f.name for f in msgspec.structs.fields(StepWire) if f.required)
# Set by the pool, never by the client: what a read adds to the write fields.
SERVER_FIELDS: tuple[str, ...] = (
    # "reward" and "reward_source" read back the effective reward (its own, else its
    # branch's, else its trajectory's: pool/services/effective_reward.py); its status and
    # where it came from:
    "reward_status",
    "reward_scope",
    # the two kinds apart: the outcome of its branch (the own final reward of the branch's
    # final step, else the trajectory's) and its own reward when it is not that step's
    "outcome_reward",
    "process_reward",
    "token_source",
    "drift",
    "drift_offset",
    "branch",
    "parent_step_uid",
    "created_at",
    # curation (pool/flags.py): readiness and quality flags as names, the operator label
    "ready",
    "readiness",
    "quality_flags",
    "label",
    # the step's images in order ([{sha256, media_type, width, height, url, ...}]; [] for none)
    "images",
)
READ_FIELDS: tuple[str, ...] = STEP_FIELDS + SERVER_FIELDS
# The idempotency fingerprint covers every submitted field but the uid (the key itself), in
# struct order, with the token arrays as their lengths (their bytes are hashed after it,
# logprobs last), plus where the ids came from. Images enter by their sha256 (or URL) and place,
# after the logprobs, and only when a step has any (plan.content_hash), so the fingerprints of
# steps without images are those of earlier releases.
# token_rewards and token_policy_versions are hashed after the images, each only when a
# step has it (plan.content_hash): the fingerprints of steps without them are unchanged.
TOKEN_ARRAYS: tuple[str, ...] = ("prompt_ids", "response_ids")
PER_TOKEN_FIELDS: tuple[str, ...] = ("token_rewards", "token_policy_versions")
CONTENT_FIELDS: tuple[str, ...] = tuple(
    f for f in STEP_FIELDS if f not in ("uid", "rollout_logprobs", "multi_modal_data", *PER_TOKEN_FIELDS)
) + ("token_source",)


@dataclass(slots=True)
class StepIn:
    """A validated step, ready to plan: StepWire with arrays as numpy, defaults applied.

    ``step_index`` and ``uid`` of an appended step (a proxied call) are set by the pipeline
    once the index is claimed. ``token_source``, ``drift``, ``drift_offset``, ``branch`` and
    ``parent_step_id`` are set by the door (the gateway knows where ids came from), never by a client.
    """

    trajectory_uid: str
    step_index: int
    prompt_ids: np.ndarray
    response_ids: np.ndarray
    uid: str = ""
    prompt_group_uid: str | None = None
    rollout_logprobs: np.ndarray | None = None
    token_rewards: np.ndarray | None = None  # float64, one per response id
    token_policy_versions: list | None = None  # [(version, count), ...], counts summing to len(response_ids)
    reward: float | None = None
    reward_source: str | None = None
    policy_version: int | None = None
    is_last: bool = False
    finish_reason: str | None = None
    messages: list | None = None
    response_text: str | None = None
    metadata: dict = field(default_factory=dict)
    # As submitted it becomes ``images`` (pool/ingest/media.py); not kept beyond that.
    multi_modal_data: dict | None = None
    images: list[ImageIn] = field(default_factory=list)  # in order; set from multi_modal_data or by the door
    token_source: str = Step.TokenSource.CLIENT
    drift: bool = False
    drift_offset: int | None = None
    branch: int = 0  # set by the door too (gateway/proxy/branches.py)
    parent_step_id: int | None = None
    field_prefix: str = ""  # e.g. "steps[3]": how errors name this step's fields
    row_id: int | None = None  # the stored row's id, once written

    def __post_init__(self) -> None:
        if not self.uid:
            self.uid = default_uid(self.trajectory_uid, self.step_index)

    def full_ids(self) -> np.ndarray:
        """prompt_ids + response_ids as one int32 array."""
        if not len(self.response_ids):
            return np.ascontiguousarray(self.prompt_ids, dtype=tokens.TOKEN_DTYPE)
        return np.concatenate((self.prompt_ids, self.response_ids)).astype(tokens.TOKEN_DTYPE, copy=False)

    def at(self, name: str) -> str:
        """The name of one of this step's fields in an error (``steps[3].reward``)."""
        return f"{self.field_prefix}.{name}" if self.field_prefix else name


def default_uid(trajectory_uid: str, step_index: int) -> str:
    return f"{trajectory_uid}:{step_index}"


# A step's free JSON field is the 4th level of its body ({"steps": [{"metadata": ...}]}): the
# nesting limit (CLAW_MAX_JSON_DEPTH) counts from the body, as for every other door.
FIELD_DEPTH = 4


# --- wire -> StepIn ----------------------------------------------------------------------------
def steps_from_wire(batch: Any) -> list[StepIn]:
    """Validated StepIns of a decoded StepBatchWire/PackedStepBatchWire: the rules a schema
    cannot state (lengths, finiteness, storable JSON), per step, never per token."""
    rules.check_batch_size(len(batch.steps))
    return [step_from_wire(s, f"steps[{i}]") for i, s in enumerate(batch.steps)]


def step_from_wire(w: Any, where: str) -> StepIn:
    prompt = _ids(w.prompt_ids, f"{where}.prompt_ids")
    response = _ids(w.response_ids, f"{where}.response_ids")
    rules.check_token_count(len(prompt), len(response), where)
    logprobs = _floats(w.rollout_logprobs, len(response), f"{where}.rollout_logprobs")
    token_rewards = _floats(w.token_rewards, len(response), f"{where}.token_rewards")
    rules.check_logprobs(logprobs, f"{where}.rollout_logprobs")
    rules.check_token_rewards(token_rewards, f"{where}.token_rewards")
    versions = _version_runs(w.token_policy_versions, len(response), f"{where}.token_policy_versions")
    rules.check_reward(w.reward, f"{where}.reward")
    for name in ("trajectory_uid", "uid", "prompt_group_uid", "finish_reason", "response_text"):
        rules.check_text(getattr(w, name), f"{where}.{name}")
    if w.messages is not None:
        rules.check_json(w.messages, f"{where}.messages", depth=FIELD_DEPTH)
    metadata = w.metadata if w.metadata is not None else {}
    rules.check_json(metadata, f"{where}.metadata", depth=FIELD_DEPTH)
    images = images_from_multi_modal_data(w.multi_modal_data, f"{where}.multi_modal_data")
    # Every other wire field passes through as decoded (the struct is the contract).
    passed = {name: getattr(w, name) for name in _PASSED_THROUGH}
    return StepIn(
        **passed,
        images=images,
        uid=w.uid or "",
        prompt_ids=prompt,
        response_ids=response,
        rollout_logprobs=logprobs,
        token_rewards=token_rewards,
        token_policy_versions=versions,
        metadata=metadata,
        field_prefix=where,
    )


_PASSED_THROUGH = tuple(
    f
    for f in STEP_FIELDS
    if f
    not in (
        "uid",
        "prompt_ids",
        "response_ids",
        "rollout_logprobs",
        "metadata",
        "multi_modal_data",
        *PER_TOKEN_FIELDS,
    )
)


def _ids(values: list[int] | bytes | msgspec.Raw, where: str) -> np.ndarray:
    if type(values) is msgspec.Raw:
        return _json_ids(bytes(values), where)
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


# What may stand between the brackets of a JSON array of non-negative integers.
_ID_TEXT = b"0123456789, \t\r\n"
_ids_decoder = msgspec.json.Decoder(list[TokenId])


def _json_ids(raw: bytes, where: str) -> np.ndarray:
    """A token id array from its JSON text (well-formed: msgspec checked it). Text of only
    digits, commas and whitespace between the brackets is an array of non-negative integers,
    which numpy parses in C (saturating at 2**63-1, so the range check sees any overflow);
    anything else (a negative, a float, a string, a nested value, an id past 2**31-1) is
    decoded by the typed decoder, whose error names the element."""
    if raw[:1] == b"[" and raw[-1:] == b"]":
        inner = raw[1:-1]
        if not inner.translate(None, _ID_TEXT):
            if not inner.strip():
                return tokens.EMPTY_IDS
            arr = np.fromstring(inner, dtype=np.int64, sep=",")
            if len(arr) == inner.count(b",") + 1 and int(arr.max()) <= rules.INT32_MAX:
                return arr.astype(tokens.TOKEN_DTYPE)
    try:
        values = _ids_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise wire_invalid(exc, prefix=where) from None
    return np.frombuffer(array("I", values), dtype=np.int32) if values else tokens.EMPTY_IDS


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD = re.compile(r"(?:missing required field|contains unknown field) `(?P<name>[^`]+)`")


def wire_invalid(exc: msgspec.ValidationError, *, prefix: str = "", default: str = "") -> InvalidInput:
    """msgspec's message (``Expected `int`, got `str` - at `$.steps[1].step_index` ``) as an
    InvalidInput naming the field (``steps[1].step_index``), its path under ``prefix`` (the
    field a value was decoded from on its own: ``steps[1].prompt_ids`` and ``$[17]`` give
    ``steps[1].prompt_ids[17]``); ``default`` when it names none."""
    m = _AT.match(str(exc))
    message = m.group("msg") if m else str(exc)
    path = (m.group("path") or "") if m else ""
    named = _FIELD.search(message)
    if named:
        path = f"{path}.{named.group('name')}"
    path = prefix + path if prefix else path.removeprefix(".")
    return InvalidInput(message, field=path or default)


def _floats(values: list[float] | bytes | None, n_response: int, where: str) -> np.ndarray | None:
    """One finite float64 per response id (rollout_logprobs, token_rewards), or None."""
    if values is None:
        return None
    name = where.rpartition(".")[2]
    if isinstance(values, bytes):
        if len(values) % 8:
            raise InvalidInput(f"packed {name} must be little-endian float64 (8 bytes each)", field=where)
        arr = np.frombuffer(values, dtype=tokens.LOGPROB_DTYPE)
    else:
        arr = np.frombuffer(array("d", values), dtype=np.float64) if values else np.zeros(0)
    if len(arr) != n_response:
        raise InvalidInput(
            f"{name} has {len(arr)} values but response_ids has {n_response} tokens", field=where
        )
    if len(arr) and not np.isfinite(arr).all():
        i = int(np.flatnonzero(~np.isfinite(arr))[0])
        raise InvalidInput("must be a finite number", field=f"{where}[{i}]")
    return arr


def _version_runs(runs: list[list[int]] | None, n_response: int, where: str) -> list[tuple[int, int]] | None:
    """token_policy_versions as (version, count) runs whose counts (each >= 1) sum to the
    response length, or None. Ranges and shapes are checked by the decoder."""
    if runs is None:
        return None
    for i, (_version, count) in enumerate(runs):
        if count < 1:
            raise InvalidInput("a run's count must be >= 1", field=f"{where}[{i}][1]")
    total = sum(count for _version, count in runs)
    if total != n_response:
        raise InvalidInput(
            f"token_policy_versions counts sum to {total} but response_ids has {n_response} tokens",
            field=where,
        )
    return [(int(v), int(c)) for v, c in runs]
