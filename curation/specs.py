"""The dataset spec: what a dataset admits (filters) and how it keeps GRPO groups whole
(grouping), and what a consumer is spared at delivery (serving). Parsed strictly: an unknown or mistyped field is an InvalidInput naming it.

    {"filters": {...}, "grouping": {...}, "serving": {...}}

Empty filters admit every ready step except those an operator rejected or quarantined
(``exclude_labels`` defaults to both; set it to [] to admit them). Every field is
documented on its struct below; docs/curation.md has the semantics.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec

from pool.errors import InvalidInput
from pool.flags import QUALITY_NAMES
from pool.ingest.rules import check_json
from pool.models import Step
from pool.services.policy import policy_check_name

QualityName = Literal[tuple(QUALITY_NAMES)]  # type: ignore[valid-type]
LabelName = Literal["none", "accepted", "rejected", "quarantined"]
TokenSource = Literal[tuple(Step.TokenSource.values)]  # type: ignore[valid-type]


class Filters(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=False):
    # "ready": only ready steps (readiness.py); "any": every stored step (exploration).
    readiness: Literal["ready", "any"] = "ready"
    # Admit steps whose ids a local tokenizer re-encoded (token_source "retokenized").
    allow_retokenized: bool = False
    # Policy freshness, at query time: current version - step's version <= max_staleness.
    # Steps without a policy version fail it; with no current version it admits all.
    max_staleness: int | None = None
    # The policy whose current version freshness follows (pool.models.Policy): max_staleness
    # here, serving.stale_after and the batches' staleness. "default": the one of before.
    policy: str = "default"
    sources: list[str] | None = None  # source names
    channel: Literal["train", "val"] | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    reward_status: Literal["final", "pending"] | None = None
    # Reward range: the step's reward, else its trajectory's.
    reward_min: float | None = None
    reward_max: float | None = None
    exclude_flags: list[QualityName] = msgspec.field(default_factory=list)
    require_flags: list[QualityName] = msgspec.field(default_factory=list)
    labels: list[LabelName] | None = None  # only these operator labels ("none": unlabelled)
    exclude_labels: list[LabelName] = msgspec.field(default_factory=lambda: ["rejected", "quarantined"])
    tags: list[str] | None = None  # any of these tags
    exclude_tags: list[str] = msgspec.field(default_factory=list)
    token_sources: list[TokenSource] | None = None
    feedback: Literal["with", "without"] | None = None  # human feedback on the step or its trajectory
    min_rating: float | None = None  # some feedback rated at least this


class Grouping(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=False):
    # Serve whole prompt groups (GRPO): a group is admitted, or none of it is.
    keep_groups_whole: bool = True
    # n of this dataset: a group counts as complete with n valid rollouts, and a group needs
    # n valid rollouts (default: the group's expected_rollouts, else 1).
    min_rollouts: int | None = None
    # A group with fewer than n valid rollouts: "drop" it, or "mask" its bad rollouts (they
    # are served with mask true, so the group stays whole).
    short_groups: Literal["drop", "mask"] = "drop"
    # How an outcome reaches the steps of a multi-step trajectory at delivery
    # (pool/services/effective_reward.py): "each_step", every step carries its effective
    # reward (its own, else its branch's, else its trajectory's); "last_step", only the last
    # step of each branch does, the others their own reward if they have one, else 0.0 with
    # reward_scope "none" (as Claw-R1's own pool serves them); "discounted_return", every
    # step its return along its branch, G_t = r_t + gamma * G_{t+1} (r_t its process
    # reward, the final step adding the branch's outcome), reward_scope "return".
    reward_assignment: Literal["each_step", "last_step", "discounted_return"] = "each_step"
    # The discount of "discounted_return", in [0, 1] (None: 1.0, the undiscounted return);
    # refused with any other assignment.
    gamma: float | None = None


class Reuse(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=False):
    max_uses: int = 1
    decay: float = 0.0


class Serving(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=False):
    """Rules applied per consumer when a unit is offered to a pull. A unit they drop is never
    served to that consumer, and the drop is counted with its reason (``Skip.reason``;
    ``GET /api/v1/consumers/{name}``)."""

    # Freshness (an off-policy bound): a unit with a step more than this many policy
    # versions behind the current one when it is offered is dropped ("stale"). Steps without
    # a policy version count as stale; with no current version nothing is.
    stale_after: int | None = None
    # What stale_after does with a stale unit: "drop" it (counted), or "serve" it anyway
    # with its versions_behind, never dropped, so slow hard rollouts reach the trainer,
    # which weighs them (each manifest counts them: stale_steps).
    stale_mode: Literal["drop", "serve"] = "drop"
    # Capacity (a bounded buffer): at most this many ready units wait for a consumer; when
    # more are ready, the oldest beyond it are dropped ("capacity"), so a slow trainer
    # keeps to recent data instead of an ever-growing backlog.
    capacity: int | None = None
    # Serving order of the units a pull may take: "oldest_ready" (ready first, first
    # served), "newest_ready", or "priority" by the named score ``priority``: "reward_std"
    # (highest within-group reward spread first: a group's spread, a step's group's spread,
    # 0 without a group) or "staleness" (least stale first: highest policy version first,
    # the unit's stalest step deciding, none below every version); ties by age (oldest
    # ready first).
    order: Literal["oldest_ready", "newest_ready", "priority"] = "oldest_ready"
    priority: Literal["reward_std", "staleness"] | None = None
    # Reuse (a replay buffer): one consumer may receive a unit up to max_uses times (an ack
    # consumes a use, a nack or expiry gives it back); each delivery records its use index.
    # Its effective priority falls with each use: base - decay x uses (Trinity-RFT); under
    # oldest_ready and newest_ready fewer uses come first. None (max_uses 1): exactly once.
    reuse: Reuse | None = None
    # Trainers' verdicts (POST /api/v1/leases/{id}/verdicts): a step served under this
    # dataset whose verdict's logprob_kl (the KL between its rollout and training logprobs)
    # is above this gets the quality flag policy_mismatch (drifting inference made visible,
    # and filterable: filters.exclude_flags). None: verdicts flag nothing.
    policy_mismatch_kl: float | None = None


class Spec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=False):
    filters: Filters = msgspec.field(default_factory=Filters)
    grouping: Grouping = msgspec.field(default_factory=Grouping)
    serving: Serving = msgspec.field(default_factory=Serving)


class DatasetIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What the dataset writes take (POST /api/v1/datasets, PUT and PATCH of one): its name and
    words, and the spec's parts as given (each parsed by ``spec_parse``; the schema documents
    them with the Spec structs). A part absent from a PATCH keeps the current version's:
    absence (UNSET) is kept apart from null."""

    name: str | msgspec.UnsetType = msgspec.UNSET
    description: str | None | msgspec.UnsetType = msgspec.UNSET
    filters: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    grouping: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET
    serving: dict[str, Any] | None | msgspec.UnsetType = msgspec.UNSET


class PreviewIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What ``POST /api/v1/datasets/preview`` takes: an unsaved spec's filters and grouping;
    ``exact``: count exactly on a large pool too (curation/selectors/specs.py, dataset_preview)."""

    filters: dict[str, Any] | None = None
    grouping: dict[str, Any] | None = None
    exact: bool = False


def given(struct: msgspec.Struct) -> dict[str, Any]:
    """The fields a request gave (UNSET ones left out), as a dict."""
    return {k: v for k, v in msgspec.structs.asdict(struct).items() if v is not msgspec.UNSET}


# The most uses a reuse budget may grant one consumer per unit.
MAX_USES = 1000

_AT = re.compile(r" - at `\$\.?(.*)`$")
_UNKNOWN = re.compile(r"Object (?:contains unknown|missing required) field `([^`]*)`")


def spec_parse(raw: Any, *, field: str = "") -> Spec:
    """A Spec from JSON-shaped input, or InvalidInput naming the bad field (prefixed with
    ``field``, e.g. "filters.max_staleness")."""
    if raw is None:
        raw = {}
    try:
        spec = msgspec.convert(raw, Spec)
    except msgspec.ValidationError as exc:
        raise InvalidInput(str(exc), field=_field_of(str(exc), field)) from None
    f, g, s = spec.filters, spec.grouping, spec.serving
    policy_check_name(f.policy, field=_join(field, "filters.policy"))
    for name, value, least in (
        ("filters.max_staleness", f.max_staleness, 0),
        ("grouping.min_rollouts", g.min_rollouts, 1),
        ("serving.stale_after", s.stale_after, 0),
        ("serving.capacity", s.capacity, 1),
        ("serving.reuse.max_uses", s.reuse.max_uses if s.reuse else None, 1),
        ("serving.reuse.decay", s.reuse.decay if s.reuse else None, 0),
    ):
        if value is not None and value < least:
            raise InvalidInput(f"{name} must be >= {least}", field=_join(field, name))
    if s.reuse is not None and s.reuse.max_uses > MAX_USES:
        raise InvalidInput(
            f"serving.reuse.max_uses must be <= {MAX_USES}", field=_join(field, "serving.reuse.max_uses")
        )
    if s.policy_mismatch_kl is not None and not (
        math.isfinite(s.policy_mismatch_kl) and s.policy_mismatch_kl >= 0
    ):
        raise InvalidInput(
            "serving.policy_mismatch_kl must be a finite number >= 0",
            field=_join(field, "serving.policy_mismatch_kl"),
        )
    if s.reuse is not None and not math.isfinite(s.reuse.decay):
        raise InvalidInput("serving.reuse.decay must be finite", field=_join(field, "serving.reuse.decay"))
    if (s.order == "priority") != (s.priority is not None):
        name = "serving.priority" if s.order == "priority" else "serving.order"
        raise InvalidInput(
            'serving.order "priority" needs serving.priority ("reward_std" or "staleness"), and '
            'serving.priority needs serving.order "priority"',
            field=_join(field, name),
        )
    if g.gamma is not None and g.reward_assignment != "discounted_return":
        raise InvalidInput(
            'grouping.gamma needs grouping.reward_assignment "discounted_return"',
            field=_join(field, "grouping.gamma"),
        )
    if g.gamma is not None and not 0.0 <= g.gamma <= 1.0:  # NaN fails both comparisons
        raise InvalidInput("grouping.gamma must be within [0, 1]", field=_join(field, "grouping.gamma"))
    for name in ("created_after", "created_before"):
        # In UTC: PostgreSQL refuses offsets beyond +-15:59 that ISO 8601 parsers accept.
        value = getattr(f, name)
        if value is not None and value.tzinfo is not None:
            try:
                f = msgspec.structs.replace(f, **{name: value.astimezone(UTC)})
            except OverflowError:
                raise InvalidInput(
                    f"filters.{name} is out of range", field=_join(field, f"filters.{name}")
                ) from None
    spec = msgspec.structs.replace(spec, filters=f)
    if f.reward_min is not None and f.reward_max is not None and f.reward_min > f.reward_max:
        raise InvalidInput(
            "filters.reward_min must be <= reward_max", field=_join(field, "filters.reward_min")
        )
    return spec


def serving_summary(serving: Serving) -> list[str]:
    """The serving rules in words, one line each (the dataset and consumption pages)."""
    order = {
        "oldest_ready": "oldest ready first",
        "newest_ready": "newest ready first",
    }.get(serving.order) or {
        "reward_std": "priority: highest within-group reward spread first, ties oldest first",
        "staleness": "priority: least stale first (highest policy version), ties oldest first",
    }.get(serving.priority or "", serving.order)
    lines = [f"Order: {order}"]
    r = serving.reuse
    if r is not None and r.max_uses > 1:
        fall = (
            f", priority falls by {r.decay:g} a use" if serving.order == "priority" else ", fewer uses first"
        )
        lines.append(f"Reuse: up to {r.max_uses} uses of a unit per consumer, one at a time{fall}")
    else:
        lines.append("Reuse: none (each unit once per consumer)")
    if serving.stale_after is not None and serving.stale_mode == "serve":
        lines.append(
            f"Fresh: units more than {serving.stale_after} policy versions behind are served, "
            "marked with their versions behind"
        )
    elif serving.stale_after is not None:
        lines.append(f"Fresh: units more than {serving.stale_after} policy versions behind are dropped")
    if serving.capacity is not None:
        lines.append(f"Capacity: at most {serving.capacity} units wait per consumer, older ones dropped")
    if serving.policy_mismatch_kl is not None:
        lines.append(
            f"Verdicts: a step whose rollout/training logprob KL is above {serving.policy_mismatch_kl:g} "
            "is flagged policy_mismatch"
        )
    return lines


def spec_dump(spec: Spec) -> dict[str, Any]:
    """The normalised JSON form (every field, defaults included) stored on a version."""
    return msgspec.to_builtins(spec)


def struct_parse(raw: Any, cls: type[msgspec.Struct], *, field: str = "", what: str = "body") -> Any:
    """``raw`` (JSON-shaped) as a ``cls``, or InvalidInput naming the bad field (``what`` when
    the whole value is wrong): the one way curation reads a request's body into its
    contract. Its text must be storable as it is (no NUL: pool.ingest.rules.check_json)."""
    check_json(raw, field)
    try:
        return msgspec.convert(raw, cls)
    except msgspec.ValidationError as exc:
        message = str(exc)
        at = _field_of(message, field)
        raise InvalidInput(message, field=what if at == "spec" and not field else at) from None


def _field_of(message: str, prefix: str) -> str:
    at = _AT.search(message)
    path = at.group(1) if at else ""
    unknown = _UNKNOWN.search(message)
    if unknown:
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
    path = re.sub(r"\[(\d+)\]", r"[\1]", path)
    return _join(prefix, path or "spec")


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
