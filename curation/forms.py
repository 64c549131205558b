"""Forms of the pages: they validate what a person typed and hand services plain values.

The dataset builder's common fields each map to one spec field (``SPEC_FIELDS``); the page's
script reads the same mapping from the fields' data attributes, so the JSON it previews is
the JSON the server saves.
"""

from __future__ import annotations

import json
from typing import Any

from django import forms

from pool.errors import InvalidInput
from pool.flags import QUALITY_NAMES
from pool.models import Channel, Step, Trajectory

from .models import GROUP_REWARDS, MODE_TRAJECTORY, MODES, ReviewQueue
from .services import consume

_BLANK = [("", "any")]
_LABELS = [
    ("none", "none"),
    ("accepted", "accepted"),
    ("rejected", "rejected"),
    ("quarantined", "quarantined"),
]
_FLAGS = [(name, name.replace("_", " ")) for name in QUALITY_NAMES]


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


class TrajectoryFilterForm(forms.Form):
    status = forms.ChoiceField(choices=_BLANK + Trajectory.Status.choices, required=False)
    channel = forms.ChoiceField(choices=_BLANK + Channel.choices, required=False)
    source = forms.CharField(max_length=128, required=False)
    group = forms.CharField(max_length=128, required=False, label="Group uid")
    has_ready = forms.BooleanField(required=False, label="Has ready steps")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class LabelForm(forms.Form):
    """An operator's change to every step of a trajectory. Blank fields change nothing."""

    ACTIONS = [
        ("", "keep label"),
        ("accepted", "accept"),
        ("rejected", "reject"),
        ("quarantined", "quarantine"),
        ("clear", "clear label"),
    ]
    action = forms.ChoiceField(choices=ACTIONS, required=False, label="Label")
    tag_add = forms.CharField(max_length=64, required=False, label="Add tag")
    tag_remove = forms.CharField(max_length=64, required=False, label="Remove tag")
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False, label="Note")

    def change(self) -> dict[str, Any]:
        """The keyword arguments of trajectories_label for this change."""
        d = self.cleaned_data
        label = {"": None, "clear": Step.Label.NONE}.get(d["action"], d["action"])
        return {
            "label": label,
            "tags_add": [d["tag_add"].strip()] if d["tag_add"].strip() else [],
            "tags_remove": [d["tag_remove"].strip()] if d["tag_remove"].strip() else [],
            "note": d["note"] if d["note"].strip() else None,
        }


# Builder field -> (spec section, kind). Kinds: str (blank = unset), int, float, bool (always
# set), csv (comma-separated list, blank = unset), multi (checked names, none = unset), list
# (checked names, always set: an empty list means something).
SPEC_FIELDS: dict[str, tuple[str, str]] = {
    "readiness": ("filters", "str"),
    "allow_retokenized": ("filters", "bool"),
    "max_staleness": ("filters", "int"),
    "channel": ("filters", "str"),
    "sources": ("filters", "csv"),
    "reward_status": ("filters", "str"),
    "reward_min": ("filters", "float"),
    "reward_max": ("filters", "float"),
    "exclude_flags": ("filters", "multi"),
    "require_flags": ("filters", "multi"),
    "labels": ("filters", "multi"),
    "exclude_labels": ("filters", "list"),
    "tags": ("filters", "csv"),
    "exclude_tags": ("filters", "csv"),
    "feedback": ("filters", "str"),
    "min_rating": ("filters", "float"),
    "keep_groups_whole": ("grouping", "bool"),
    "min_rollouts": ("grouping", "int"),
    "short_groups": ("grouping", "str"),
    "reward_assignment": ("grouping", "str"),
    "gamma": ("grouping", "float"),
    "stale_after": ("serving", "int"),
    "stale_mode": ("serving", "str"),
    "capacity": ("serving", "int"),
    # Serving order and reuse (specs.Serving): a section with a dot is a nested struct.
    "order": ("serving", "str"),
    "priority": ("serving", "str"),
    "max_uses": ("serving.reuse", "int"),
    "decay": ("serving.reuse", "float"),
}


class DatasetForm(forms.Form):
    """The filter builder and "save as dataset". The spec is the JSON textarea when
    ``advanced`` is checked, else the common fields."""

    readiness = forms.ChoiceField(
        choices=[("ready", "ready steps only"), ("any", "any stored step")], initial="ready"
    )
    allow_retokenized = forms.BooleanField(required=False, label="Allow retokenized ids")
    max_staleness = forms.IntegerField(required=False, min_value=0, label="Max policy staleness")
    channel = forms.ChoiceField(choices=_BLANK + Channel.choices, required=False)
    sources = forms.CharField(required=False, help_text="comma-separated source names")
    reward_status = forms.ChoiceField(
        choices=_BLANK + [("final", "final"), ("pending", "pending")], required=False
    )
    reward_min = forms.FloatField(required=False)
    reward_max = forms.FloatField(required=False)
    exclude_flags = forms.MultipleChoiceField(
        choices=_FLAGS, required=False, widget=forms.CheckboxSelectMultiple, label="Exclude quality flags"
    )
    require_flags = forms.MultipleChoiceField(
        choices=_FLAGS, required=False, widget=forms.CheckboxSelectMultiple, label="Require quality flags"
    )
    labels = forms.MultipleChoiceField(
        choices=_LABELS, required=False, widget=forms.CheckboxSelectMultiple, label="Only labels"
    )
    exclude_labels = forms.MultipleChoiceField(
        choices=_LABELS,
        required=False,
        widget=forms.CheckboxSelectMultiple,
        initial=["rejected", "quarantined"],
        label="Exclude labels",
    )
    tags = forms.CharField(required=False, help_text="any of these tags, comma-separated")
    exclude_tags = forms.CharField(required=False, help_text="comma-separated")
    feedback = forms.ChoiceField(
        choices=_BLANK + [("with", "with feedback"), ("without", "without feedback")], required=False
    )
    min_rating = forms.FloatField(required=False)
    keep_groups_whole = forms.BooleanField(required=False, initial=True, label="Keep groups whole")
    min_rollouts = forms.IntegerField(required=False, min_value=1, label="Min rollouts (n)")
    short_groups = forms.ChoiceField(
        choices=[("drop", "drop short groups"), ("mask", "mask bad rollouts")], initial="drop"
    )
    reward_assignment = forms.ChoiceField(
        choices=[
            ("each_step", "every step carries the reward"),
            ("last_step", "only the last step (others 0)"),
            ("discounted_return", "each step its discounted return"),
        ],
        initial="each_step",
        required=False,
        label="Outcome reward",
    )
    gamma = forms.FloatField(
        required=False,
        min_value=0,
        max_value=1,
        label="Discount (gamma)",
        help_text="with discounted return: G = process reward + gamma x the next step's G (blank: 1)",
    )
    stale_after = forms.IntegerField(
        required=False,
        min_value=0,
        label="Drop units staler than",
        help_text="policy versions, when offered to a consumer (counted)",
    )
    stale_mode = forms.ChoiceField(
        choices=[("drop", "drop them (counted)"), ("serve", "serve them with their versions behind")],
        initial="drop",
        required=False,
        label="Stale units",
        help_text="with a staleness bound: drop stale units, or serve them for the trainer to weigh",
    )
    capacity = forms.IntegerField(
        required=False,
        min_value=1,
        label="Consumer capacity",
        help_text="ready units waiting per consumer; the oldest beyond it are dropped (counted)",
    )
    order = forms.ChoiceField(
        choices=[
            ("oldest_ready", "oldest ready first"),
            ("newest_ready", "newest ready first"),
            ("priority", "by priority"),
        ],
        initial="oldest_ready",
        required=False,
        label="Serving order",
    )
    priority = forms.ChoiceField(
        choices=[("", "none"), ("reward_std", "highest reward spread"), ("staleness", "least stale")],
        required=False,
        label="Priority",
        help_text="with order by priority; ties oldest first",
    )
    max_uses = forms.IntegerField(
        required=False,
        min_value=1,
        label="Uses per consumer",
        help_text="reuse: a unit served up to this many times to a consumer (blank: once)",
    )
    decay = forms.FloatField(
        required=False, min_value=0, label="Priority decay", help_text="priority lost per use (reuse)"
    )
    advanced = forms.BooleanField(required=False, label="Edit the JSON spec directly")
    spec = forms.CharField(widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}), required=False)
    name = forms.CharField(max_length=64, required=False, help_text="an existing name gets a new version")
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, (section, kind) in SPEC_FIELDS.items():
            self.fields[name].widget.attrs.update({"data-spec": f"{section}.{name}", "data-kind": kind})

    def builder_fields(self) -> list[forms.BoundField]:
        """The common fields, in the spec's order (the template lays them out)."""
        return [self[name] for name in SPEC_FIELDS]

    @staticmethod
    def initial_from_spec(spec: dict[str, Any]) -> dict[str, Any]:
        """Initial field values showing a stored (normalised) spec."""
        initial: dict[str, Any] = {"spec": json.dumps(spec, indent=2)}
        for name, (section, kind) in SPEC_FIELDS.items():
            part: Any = spec
            for key in section.split("."):
                part = (part or {}).get(key)
            value = (part or {}).get(name)
            if value is None:
                continue
            initial[name] = ", ".join(value) if kind == "csv" else value
        return initial

    def spec_raw(self) -> dict[str, Any]:
        """The spec as JSON-shaped data (not yet parsed), or InvalidInput naming the field."""
        d = self.cleaned_data
        if d["advanced"]:
            try:
                raw = json.loads(d["spec"] or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidInput(f"the spec is not JSON: {exc}", field="spec") from None
            return raw
        raw: dict[str, dict[str, Any]] = {"filters": {}, "grouping": {}, "serving": {}}
        for name, (section, kind) in SPEC_FIELDS.items():
            value = d.get(name)
            if kind == "csv":
                value = _csv(value or "") or None
            elif kind == "multi":
                value = list(value) or None
            elif kind == "list":
                value = list(value or [])
            elif kind == "bool":
                value = bool(value)
            elif value == "":
                value = None
            if value is not None:
                top, _, nested = section.partition(".")
                (raw[top].setdefault(nested, {}) if nested else raw[top])[name] = value
        return raw


class ReviewForm(forms.Form):
    """A reviewer's feedback on one claimed item, shaped by its queue's score schema: the
    rating as stars (a small integer range) or a slider with its number box, the labels as
    buttons (one) or chips (several), a comment. The values are checked against the schema
    by review_check (curation/services/review.py), whose errors name the field."""

    claim = forms.IntegerField(widget=forms.HiddenInput)
    rating = forms.FloatField(required=False)
    label = forms.CharField(max_length=64, required=False)
    correction = forms.CharField(widget=forms.Textarea(attrs={"rows": 4}), required=False)
    comment = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)

    def __init__(self, *args: Any, queue: ReviewQueue, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = queue
        rating = self.fields["rating"]
        rating.required = queue.sets_reward
        step = "1" if queue.rating_widget == "stars" else "any"
        rating.widget.attrs.update({"min": queue.rating_min, "max": queue.rating_max, "step": step})
        # The range itself is checked by review_submit, whose error names the queue's bounds.
        rating.help_text = f"{queue.rating_min:g} to {queue.rating_max:g}"
        if queue.label_choices:
            choices = [(c, c) for c in queue.label_choices]
            if queue.label_multi:
                self.fields["label"] = forms.MultipleChoiceField(
                    choices=choices, required=False, widget=forms.CheckboxSelectMultiple
                )
            else:
                self.fields["label"] = forms.ChoiceField(
                    choices=[("", "no label")] + choices, required=False, widget=forms.RadioSelect
                )
        if not queue.ask_correction:
            del self.fields["correction"]

    def stars(self) -> list[dict[str, Any]]:
        """The star widget's choices: value, whether checked, and its hotkey."""
        q = self.queue
        current = self["rating"].value()
        try:
            chosen = float(current) if current not in (None, "") else None
        except (TypeError, ValueError):
            chosen = None
        return [
            {"value": v, "checked": chosen == v, "key": str(v) if v <= 9 else ""}
            for v in range(int(q.rating_min), int(q.rating_max) + 1)
        ]

    def slider_step(self) -> float:
        return (self.queue.rating_max - self.queue.rating_min) / 100

    def labels(self) -> list[str]:
        value = self.cleaned_data.get("label")
        if isinstance(value, list):
            return value
        return [value] if value else []


class GroupReviewForm(forms.Form):
    """Group mode: a rank per rollout (``rank-<trajectory id>``, 1 = best), or with a queue
    whose ``group_reward`` is "best", the best rollout alone (``best``). ``ranking()``: the
    trajectory ids, best first; the ranks must be 1..n, each once."""

    claim = forms.IntegerField(widget=forms.HiddenInput)
    comment = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)

    def __init__(self, *args: Any, queue: ReviewQueue, rollouts: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue, self.rollouts = queue, rollouts
        self.best_mode = queue.group_reward == "best"
        n = len(rollouts)
        if self.best_mode:
            self.fields["best"] = forms.TypedChoiceField(
                choices=[(t.id, str(i)) for i, t in enumerate(rollouts, start=1)],
                coerce=int,
                required=True,
                widget=forms.RadioSelect,
                error_messages={"required": "pick the best rollout"},
            )
        else:
            for t in rollouts:
                self.fields[f"rank-{t.id}"] = forms.TypedChoiceField(
                    choices=[("", "–")] + [(r, str(r)) for r in range(1, n + 1)],
                    coerce=int,
                    required=True,
                    label="Rank",
                    error_messages={"required": "give every rollout a rank"},
                )

    def clean(self) -> dict[str, Any]:
        d = super().clean()
        if not self.best_mode and not self.errors:
            ranks = [d.get(f"rank-{t.id}") for t in self.rollouts]
            if sorted(ranks) != list(range(1, len(self.rollouts) + 1)):
                raise forms.ValidationError(
                    "ranking: give each rank from 1 to %(n)s once", params={"n": len(ranks)}
                )
        return d

    def ranking(self) -> list[int]:
        d = self.cleaned_data
        if self.best_mode:
            return [d["best"]]
        return [t.id for t in sorted(self.rollouts, key=lambda t: d[f"rank-{t.id}"])]

    def rows(self) -> list[tuple[Any, forms.BoundField | None]]:
        """(rollout, its rank field) per rollout; no field in best mode."""
        return [(t, None if self.best_mode else self[f"rank-{t.id}"]) for t in self.rollouts]


class QueueFilterForm(DatasetForm):
    """The dataset builder's filter fields alone (and its JSON spec, for the advanced), as
    on /curation/: a review queue's scope. ``filters()``: the spec's filters section."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, (section, _) in SPEC_FIELDS.items():
            if section != "filters":
                del self.fields[name]
        del self.fields["name"], self.fields["description"]
        self.fields["readiness"].required = False  # blank: the spec's default

    def builder_fields(self) -> list[forms.BoundField]:
        return [self[name] for name, (section, _) in SPEC_FIELDS.items() if section == "filters"]

    def filters(self) -> dict[str, Any]:
        raw = self.spec_raw()
        filters = raw.get("filters", {}) if isinstance(raw, dict) else None
        if not isinstance(filters, dict):
            raise InvalidInput("filters must be an object", field="spec")
        return filters


class QueueForm(forms.Form):
    """A new review queue (or, with ``edit``, the fields that can change on an existing
    one): over a dataset, or over the filters of the dataset builder (DatasetForm, shown
    beside it: the same fields as /curation/)."""

    name = forms.CharField(max_length=64)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    guidelines = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 6}),
        required=False,
        help_text="Markdown, shown beside each item (no HTML; links to http(s) only)",
    )
    dataset = forms.ChoiceField(required=False, help_text="or the filters below")
    mode = forms.ChoiceField(choices=MODES, initial=MODE_TRAJECTORY, required=False)
    rating_min = forms.FloatField(initial=1.0)
    rating_max = forms.FloatField(
        initial=5.0, help_text="a range of up to 10 whole numbers shows stars, else a slider"
    )
    label_choices = forms.CharField(required=False, help_text="comma-separated; blank: free text")
    label_multi = forms.BooleanField(required=False, label="Several labels per item")
    ask_correction = forms.BooleanField(required=False)
    sets_reward = forms.BooleanField(required=False, help_text="the rating becomes the human reward")
    group_reward = forms.ChoiceField(
        choices=GROUP_REWARDS,
        initial="none",
        required=False,
        label="Group reward",
        help_text="group mode: what a ranking writes",
    )
    reviews_per_item = forms.IntegerField(
        min_value=1, max_value=20, initial=1, required=False, label="Reviews per item"
    )

    EDITABLE = ("description", "guidelines", "dataset", "reviews_per_item")

    def __init__(
        self, *args: Any, datasets: list[tuple[int, str]], edit: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["dataset"].choices = [("", "none: use the filters")] + [(str(i), n) for i, n in datasets]
        if edit:
            for name in list(self.fields):
                if name not in self.EDITABLE:
                    del self.fields[name]

    def queue_kwargs(self, filters: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of review_queue_create."""
        d = self.cleaned_data
        return {
            "name": d["name"],
            "description": d["description"],
            "guidelines": d["guidelines"],
            "dataset_id": int(d["dataset"]) if d["dataset"] else None,
            "filters": filters,
            "mode": d["mode"] or MODE_TRAJECTORY,
            "rating_min": d["rating_min"],
            "rating_max": d["rating_max"],
            "label_choices": _csv(d["label_choices"]),
            "label_multi": d["label_multi"],
            "ask_correction": d["ask_correction"],
            "sets_reward": d["sets_reward"],
            "group_reward": d["group_reward"] or "none",
            "reviews_per_item": d["reviews_per_item"] or 1,
        }

    def update_kwargs(self, filters: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments of review_queue_update."""
        d = self.cleaned_data
        return {
            "description": d["description"],
            "guidelines": d["guidelines"],
            "dataset_id": int(d["dataset"]) if d["dataset"] else None,
            "filters": filters,
            "reviews_per_item": d["reviews_per_item"] or 1,
        }


# --- dashboard pages ----------------------------------------------------------------------------
class StepFilterForm(forms.Form):
    """Filters of the step list (representation page)."""

    source = forms.CharField(max_length=128, required=False)
    token_source = forms.ChoiceField(choices=_BLANK + Step.TokenSource.choices, required=False)
    drift = forms.BooleanField(required=False, label="Drift only")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class BatchForm(forms.Form):
    """A trainer's batch configuration: what ``POST /api/v1/consumers/<name>/pull`` would
    ask for, plus a freshness bound (max policy staleness) previewed over the dataset's spec."""

    # The pull contract's choices (curation/services/consume.py PullIn), labelled.
    FORMATS = [(f, "tree (prefix-packed)" if f == "tree" else f) for f in consume.FORMATS]
    UNITS = [("", "the dataset's (groups if kept whole)"), *((u, u) for u in consume.UNITS)]

    dataset = forms.ChoiceField(choices=[], required=False)
    batch_size = forms.IntegerField(
        min_value=1, max_value=consume.MAX_BATCH, initial=64, required=False, label="Batch size"
    )
    unit = forms.ChoiceField(choices=UNITS, required=False)
    format = forms.ChoiceField(choices=FORMATS, required=False)
    max_staleness = forms.IntegerField(
        min_value=0,
        required=False,
        label="Freshness (max policy staleness)",
        help_text="blank: the dataset's own bound",
    )

    def __init__(self, *args: Any, datasets: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self.fields["dataset"], datasets)


class SnapshotForm(forms.Form):
    dataset = forms.ChoiceField(choices=[])

    def __init__(self, *args: Any, datasets: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choices(self.fields["dataset"], datasets)


def _choices(field: forms.Field, names: list[str]) -> None:
    assert isinstance(field, forms.ChoiceField)
    field.choices = [(n, n) for n in names]
