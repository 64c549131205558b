"""Admin for curation work on steps, trajectories and prompt groups.

Lists filter on every curation signal (curation/admin/filters.py) at a fixed number of queries
per page: the heavy columns are deferred and related rows come in the same query. Pages
are read-only; every change goes through a bulk action that calls a service
(curation.services.labels.steps_label / trajectories_label, pool.services.rewards.rewards_apply), so each
one is audited as a LabelEvent or a RewardEvent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import connections, transaction
from django.db.models import QuerySet
from django.db.models.functions import Substr
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe

from pool import tokens
from pool.errors import PoolError
from pool.flags import QUALITY_NAMES, READINESS_NAMES, READY, names, quality_text, readiness_text
from pool.models import PromptGroup, RewardEvent, Step, Trajectory
from pool.replica import ReplicaChangelist
from pool.services.rewards import RewardIn, rewards_apply

from ..models import LabelEvent, StepTag
from ..services.labels import steps_label, trajectories_label
from .filters import FeedbackFilter, GroupReadyFilter, LabelFilter, QualityFilter, ReadinessFilter, TagFilter

# Longest tag (curation.services.labels.MAX_TAG_LEN; curation imports pool, not the reverse).
MAX_TAG_LEN = 64
# Never read by a page: token blobs and hashes (ids are rebuilt with pool.tokens).
STEP_BLOBS = (
    "seq_delta", "rollout_logprobs", "token_rewards", "token_versions", "seq_hash", "content_hash", "response_hash",
)  # fmt: skip
# Not shown in the step list either: JSON and free text can each be megabytes.
STEP_LIST_HEAVY = (*STEP_BLOBS, "messages", "response_text", "metadata", "note", "trajectory__metadata")
# Ids shown at each end of a long sequence: a 100k-token step's page stays small and fast.
IDS_SHOWN = 200
# Characters of stored text shown on a step page (the rest is cut, and says so).
TEXT_SHOWN = 20_000
# Characters of the response in a trajectory's step rows.
EXCERPT_CHARS = 120
# Steps listed on a trajectory page; the step list (filtered by trajectory) shows them all.
INLINE_STEPS = 200
# History rows on a step page.
HISTORY_ROWS = 50


# The step list's short names of the readiness conditions and quality flags (the full names
# are the filters' and the change page's; the list shows them on hover).
READINESS_SHORT = {
    "tokens_exact": "tokens",
    "reward_final": "reward",
    "trajectory_complete": "traj",
    "group_complete": "group",
}
QUALITY_SHORT = {"missing_logprobs": "no logprobs", "zero_variance": "0 variance", "repetition": "repeats"}
# Characters of a uid shown in the step list (the whole uid on hover).
UID_SHOWN = 13


def _cut(uid: str) -> str:
    if len(uid) <= UID_SHOWN:
        return uid
    return format_html('<span title="{}">{}…</span>', uid, uid[: UID_SHOWN - 1])


class CappedCountPaginator(Paginator):
    """Counts a filtered list only up to COUNT_CAP rows (``SELECT COUNT(*) FROM (... LIMIT
    n)``, unordered, so the scan stops at the n-th match): an exact count of a filter
    matching most of a large pool is a full scan on every page view, and nobody pages past
    the first ten pages of steps (they filter instead). The list then reads "1001 steps" at
    most; the pool's totals are on the pool page. The cap bounds the count's work by the
    rows it takes to find 1,001 matches, whatever the pool's size: with 10,000 and the list
    ordered, counting the ready truncated steps of a 1M-step pool took 531 ms of the page's
    805 ms (the whole page took 119 ms at 100k steps; bench/growth.py).

    On PostgreSQL the count runs without parallel workers: from about 1M steps the planner
    took the capped scan for a big one and gathered it over two workers, whose start cost
    30 ms of the count's 34 ms (the scan itself ~1 ms; bench.growth --explain), the admin
    list's step from 58 to 83 ms between 100k and 1M steps."""

    COUNT_CAP = 1_000

    @cached_property
    def count(self) -> int:
        alias = self.object_list.db  # the replica, on a page that reads from one
        capped = self.object_list.using(alias).order_by()[: self.COUNT_CAP + 1]
        conn = connections[alias]
        if conn.vendor != "postgresql":
            return capped.count()
        with transaction.atomic(using=alias), conn.cursor() as cur:
            cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            return capped.count()


class StepActionForm(ActionForm):
    """The values the step actions take; each action checks only the one it needs
    (ACTION_VALUES), so a stray value in another box never blocks an action."""

    tag = forms.CharField(required=False, label="tag", widget=forms.TextInput(attrs={"size": 12}))
    note = forms.CharField(required=False, label="note", widget=forms.TextInput(attrs={"size": 24}))
    reward = forms.CharField(required=False, label="reward", widget=forms.TextInput(attrs={"size": 6}))


ACTION_VALUES: dict[str, forms.Field] = {
    "tag": forms.CharField(max_length=MAX_TAG_LEN),
    "note": forms.CharField(),
    "reward": forms.FloatField(),  # rejects nan and infinities too
}


@admin.register(Step)
class StepAdmin(ReplicaChangelist, admin.ModelAdmin):
    # Short columns, so that the list fits 1440 px with the sidebar and the filters: uids cut
    # (whole on hover), readiness and quality as short names (the full text on hover).
    list_display = (
        "uid_short",
        "trajectory_short",
        "tokens_short",
        "reward_short",
        "readiness_short",
        "quality_short",
        "label_short",
        "policy",
        "created_short",
    )
    list_filter = (
        ReadinessFilter,
        QualityFilter,
        LabelFilter,
        TagFilter,
        FeedbackFilter,
        "reward_status",
        "reward_scope",
        "effective_reward_source",
        "token_source",
        "drift",
        "is_last",
        "policy_version",
        "trajectory__channel",
        "trajectory__status",
        "source",
    )
    search_fields = ("uid", "trajectory__uid", "response_text")
    list_select_related = ("trajectory",)

    class Media:
        css = {"all": ("claw/admin.css",)}

    list_per_page = 100
    paginator = CappedCountPaginator
    show_full_result_count = False
    # Facet counts would count every filter option over the whole table on each page view.
    show_facets = admin.ShowFacets.NEVER
    action_form = StepActionForm
    actions = (
        "accept",
        "reject",
        "quarantine",
        "clear_label",
        "add_tag",
        "remove_tag",
        "set_note",
        "clear_note",
        "set_reward",
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("uid", "trajectory", "step_index"),
                    ("policy_version_id", "token_source", "source"),
                    ("readiness_display", "quality_display"),
                    ("label", "tags_display"),
                    "note",
                )
            },
        ),
        (
            "Reward",
            {
                "fields": (
                    ("reward_display", "effective_reward_source"),
                    ("reward", "reward_status", "reward_source"),
                    "reward_history",
                )
            },
        ),
        ("Prompt", {"fields": (("prompt_text", "prompt_ids"),)}),
        ("Response", {"fields": (("response_text_display", "response_ids"), ("finish_reason", "is_last"))}),
        (
            "Storage",
            {
                "classes": ("collapse",),
                "fields": (
                    ("seq_len", "prompt_len"),
                    ("seq_parent_id", "seq_shared", "seq_depth"),
                    ("drift", "drift_offset"),
                    "metadata_display",
                    ("created_at", "updated_at"),
                ),
            },
        ),
        ("Label history", {"fields": ("label_history",)}),
    )
    readonly_fields = tuple(
        name for row in fieldsets for f in row[1]["fields"] for name in (f if isinstance(f, tuple) else (f,))
    )

    # --- queries ---------------------------------------------------------------------------
    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request).select_related("trajectory")
        match = request.resolver_match
        if match is not None and match.url_name == "pool_step_changelist":
            return qs.defer(*STEP_LIST_HEAVY)
        return qs.defer(*STEP_BLOBS)

    # --- permissions: pages are read-only, changes go through the actions -------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # steps are written by the ingest pipeline only

    def has_change_permission(self, request: HttpRequest, obj: Step | None = None) -> bool:
        # A change of one step's form would bypass the services (and their audit); the
        # actions, which check this permission without an object, are the way to change.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Step | None = None) -> bool:
        return False  # retention deletes steps; the audit rows cascade with them

    # --- list columns --------------------------------------------------------------------------
    @admin.display(description="reward (scope)", ordering="effective_reward")
    def reward_display(self, obj: Step) -> str:
        return reward_text(obj)

    @admin.display(description="readiness", ordering="readiness")
    def readiness_display(self, obj: Step) -> str:
        return readiness_text(obj.readiness)

    @admin.display(description="quality", ordering="quality_flags")
    def quality_display(self, obj: Step) -> str:
        return quality_text(obj.quality_flags)

    @admin.display(description="uid", ordering="uid")
    def uid_short(self, obj: Step) -> str:
        return _cut(obj.uid)

    @admin.display(description="trajectory #", ordering="trajectory__uid")
    def trajectory_short(self, obj: Step) -> str:
        return format_html("{} #{}", _cut(obj.trajectory.uid), obj.step_index)

    @admin.display(description="reward", ordering="effective_reward")
    def reward_short(self, obj: Step) -> str:
        if obj.effective_reward is None:
            return "–"
        return format_html('<span title="scope: {}">{}</span>', obj.reward_scope, f"{obj.effective_reward:g}")

    @admin.display(description="label", ordering="label")
    def label_short(self, obj: Step) -> str:
        return "–" if obj.label == Step.Label.NONE else obj.get_label_display()

    @admin.display(description="tokens", ordering="seq_len")
    def tokens_short(self, obj: Step) -> str:
        """The count, and where the ids came from when not exact (the token source filter
        lists them all)."""
        if obj.token_source in (Step.TokenSource.CLIENT, Step.TokenSource.UPSTREAM):
            return format_html(
                '<span title="ids from the {}">{}</span>', obj.token_source, f"{obj.seq_len:,}"
            )
        return format_html('{} <span class="claw-warn">{}</span>', f"{obj.seq_len:,}", obj.token_source)

    @admin.display(description="readiness", ordering="readiness")
    def readiness_short(self, obj: Step) -> str:
        if obj.readiness == READY:
            return mark_safe('<span class="claw-ok" title="ready">ready</span>')  # noqa: S308 (a constant)
        missing = names(READY & ~obj.readiness, READINESS_NAMES)
        return format_html(
            '<span title="{}">needs {}</span>',
            readiness_text(obj.readiness),
            ", ".join(READINESS_SHORT.get(m, m) for m in missing),
        )

    @admin.display(description="quality", ordering="quality_flags")
    def quality_short(self, obj: Step) -> str:
        flags = names(obj.quality_flags, QUALITY_NAMES)
        if not flags:
            return mark_safe('<span class="claw-ok" title="no quality flag">clean</span>')  # noqa: S308 (a constant)
        return format_html(
            '<span title="{}">{}</span>',
            quality_text(obj.quality_flags),
            ", ".join(QUALITY_SHORT.get(f, f) for f in flags),
        )

    @admin.display(description="created", ordering="created_at")
    def created_short(self, obj: Step) -> str:
        local = timezone.localtime(obj.created_at)
        return format_html(
            '<span title="{}">{}</span>', local.isoformat(timespec="seconds"), local.strftime("%m-%d %H:%M")
        )

    @admin.display(description="policy", ordering="policy_version")
    def policy(self, obj: Step) -> int | None:
        return obj.policy_version_id  # the version number itself: no join

    # --- change page ---------------------------------------------------------------------------
    @admin.display(description="prompt ids")
    def prompt_ids(self, obj: Step) -> str:
        return _ids_html(_full_ids(obj)[: obj.prompt_len])

    @admin.display(description="response ids")
    def response_ids(self, obj: Step) -> str:
        return _ids_html(_full_ids(obj)[obj.prompt_len :])

    @admin.display(description="prompt (messages)")
    def prompt_text(self, obj: Step) -> str:
        if not obj.messages:
            return "text unknown"
        return _text_html(json.dumps(obj.messages, indent=2, ensure_ascii=False))

    @admin.display(description="response text")
    def response_text_display(self, obj: Step) -> str:
        return "text unknown" if obj.response_text is None else _text_html(obj.response_text)

    @admin.display(description="metadata")
    def metadata_display(self, obj: Step) -> str:
        return _text_html(json.dumps(obj.metadata, indent=2, ensure_ascii=False))

    @admin.display(description="tags")
    def tags_display(self, obj: Step) -> str:

        return ", ".join(StepTag.objects.filter(step=obj).order_by("tag").values_list("tag", flat=True))

    @admin.display(description="label history")
    def label_history(self, obj: Step) -> str:

        rows = LabelEvent.objects.filter(step=obj).order_by("-created_at", "-id")[:HISTORY_ROWS]
        return _history_html(
            (e.created_at.isoformat(timespec="seconds"), e.actor, json.dumps(e.changes)) for e in rows
        )

    @admin.display(description="reward history")
    def reward_history(self, obj: Step) -> str:
        rows = RewardEvent.objects.filter(step=obj).order_by("-created_at", "-id")[:HISTORY_ROWS]
        return _history_html(
            (
                e.created_at.isoformat(timespec="seconds"),
                f"{e.reward_source}{'' if e.final else ' (pending)'}",
                f"{e.old_reward} → {e.new_reward}",
            )
            for e in rows
        )

    # --- actions -------------------------------------------------------------------------------
    @admin.action(description="Accept selected steps", permissions=["change"])
    def accept(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "accepted", label=Step.Label.ACCEPTED)

    @admin.action(description="Reject selected steps", permissions=["change"])
    def reject(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "rejected", label=Step.Label.REJECTED)

    @admin.action(description="Quarantine selected steps", permissions=["change"])
    def quarantine(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "quarantined", label=Step.Label.QUARANTINED)

    @admin.action(description="Clear the label of selected steps", permissions=["change"])
    def clear_label(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "cleared the label of", label=Step.Label.NONE)

    @admin.action(description="Add tag (give a tag) to selected steps", permissions=["change"])
    def add_tag(self, request: HttpRequest, queryset: QuerySet) -> None:
        tag = self._value(request, "tag", "Give a tag to add.")
        if tag is not None:
            self._label(request, queryset, f"tagged {tag!r}", tags_add=[tag])

    @admin.action(description="Remove tag (give a tag) from selected steps", permissions=["change"])
    def remove_tag(self, request: HttpRequest, queryset: QuerySet) -> None:
        tag = self._value(request, "tag", "Give a tag to remove.")
        if tag is not None:
            self._label(request, queryset, f"untagged {tag!r}", tags_remove=[tag])

    @admin.action(description="Set note (give a note) on selected steps", permissions=["change"])
    def set_note(self, request: HttpRequest, queryset: QuerySet) -> None:
        note = self._value(request, "note", "Give a note to set (or use “clear note”).")
        if note is not None:
            self._label(request, queryset, "set the note of", note=note)

    @admin.action(description="Clear the note of selected steps", permissions=["change"])
    def clear_note(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "cleared the note of", note="")

    @admin.action(
        description="Set final human reward (give a reward) on selected steps", permissions=["change"]
    )
    def set_reward(self, request: HttpRequest, queryset: QuerySet) -> None:
        reward = self._value(request, "reward", "Give a reward (a finite number) to set.")
        if reward is None:
            return
        uids = list(queryset.order_by().values_list("uid", flat=True))
        actor = request.user.get_username()
        try:
            events = rewards_apply(
                rewards=[
                    RewardIn(
                        reward=reward, step_uid=uid, source=Step.RewardSource.HUMAN, metadata={"actor": actor}
                    )
                    for uid in uids
                ]
            )
        except PoolError as exc:
            self.message_user(request, f"No reward set: {exc.message}", messages.ERROR)
            return
        self.message_user(request, f"Set reward {reward} on {len(uids)} steps ({len(events)} changed).")

    def _value(self, request: HttpRequest, name: str, missing: str) -> Any:
        """The action form's ``name`` value, or None after telling the user what is wrong."""
        try:
            return ACTION_VALUES[name].clean(request.POST.get(name, ""))
        except ValidationError as exc:
            self.message_user(
                request, f"{missing} {' '.join(exc.messages)} Nothing was changed.", messages.ERROR
            )
            return None

    def _label(self, request: HttpRequest, queryset: QuerySet, verb: str, **change: Any) -> None:
        _label_with(
            self,
            request,
            lambda **kw: steps_label(step_ids=queryset.order_by().values_list("id", flat=True), **kw),
            verb,
            "steps",
            **change,
        )


class StepInlineFormSet(BaseInlineFormSet):
    def get_queryset(self) -> QuerySet:
        # The first steps only: a trajectory can hold thousands (the step list shows them all).
        if not hasattr(self, "_bounded"):
            self._bounded = super().get_queryset()[:INLINE_STEPS]
        return self._bounded


class StepInline(admin.TabularInline):
    model = Step
    formset = StepInlineFormSet
    fields = (
        "step_index",
        "uid",
        "readiness_display",
        "quality_display",
        "reward_display",
        "label",
        "excerpt",
    )
    readonly_fields = fields
    ordering = ("step_index",)
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .only(
                "id",
                "trajectory_id",
                "step_index",
                "uid",
                "readiness",
                "quality_flags",
                "effective_reward",
                "reward_scope",
                "label",
            )
            .annotate(_excerpt=Substr("response_text", 1, EXCERPT_CHARS + 1))
        )

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="readiness")
    def readiness_display(self, obj: Step) -> str:
        return readiness_text(obj.readiness)

    @admin.display(description="quality")
    def quality_display(self, obj: Step) -> str:
        return quality_text(obj.quality_flags)

    @admin.display(description="reward (scope)")
    def reward_display(self, obj: Step) -> str:
        return reward_text(obj)

    @admin.display(description="response")
    def excerpt(self, obj: Step) -> str:
        text = obj._excerpt  # type: ignore[attr-defined]
        if text is None:
            return "text unknown"
        return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "…"


def reward_text(step: Step) -> str:
    """A step's effective reward and where it came from (pool/services/effective_reward.py):
    "1.0 (trajectory)", or "–" while there is none."""
    if step.effective_reward is None:
        return "–"
    return f"{step.effective_reward:g} ({step.reward_scope})"


@admin.register(Trajectory)
class TrajectoryAdmin(ReplicaChangelist, admin.ModelAdmin):
    list_display = (
        "uid",
        "group",
        "status",
        "channel",
        "reward",
        "step_count",
        "policy",
        "source",
        "created_at",
    )
    list_filter = ("status", "channel", "group__status", "policy_version", "source")
    search_fields = ("uid", "group__uid")
    list_select_related = ("group", "source")
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    inlines = (StepInline,)
    fields = (
        ("uid", "group", "source"),
        ("status", "channel", "policy_version_id"),
        ("reward", "step_count"),
        "all_steps",
        "metadata",
        ("created_at", "updated_at", "completed_at"),
    )
    readonly_fields = (
        "uid",
        "group",
        "source",
        "status",
        "channel",
        "policy_version_id",
        "reward",
        "step_count",
        "all_steps",
        "metadata",
        "created_at",
        "updated_at",
        "completed_at",
    )
    actions = ("accept", "reject", "quarantine", "clear_label")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # trajectories are created by the ingest pipeline and the API

    def has_change_permission(self, request: HttpRequest, obj: Trajectory | None = None) -> bool:
        # Read-only page (a hand-edited status would skip readiness); the actions label steps.
        return obj is None and super().has_change_permission(request)

    @admin.display(description="policy", ordering="policy_version")
    def policy(self, obj: Trajectory) -> int | None:
        return obj.policy_version_id

    @admin.display(description="steps")
    def all_steps(self, obj: Trajectory) -> str:
        url = reverse("admin:pool_step_changelist") + "?" + urlencode({"trajectory__id__exact": obj.pk})
        return format_html(
            '<a href="{}">all {} steps in the step list</a> (below: the first {})',
            url,
            obj.step_count,
            INLINE_STEPS,
        )

    @admin.action(description="Accept every step of selected trajectories", permissions=["change"])
    def accept(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "accepted", label=Step.Label.ACCEPTED)

    @admin.action(description="Reject every step of selected trajectories", permissions=["change"])
    def reject(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "rejected", label=Step.Label.REJECTED)

    @admin.action(description="Quarantine every step of selected trajectories", permissions=["change"])
    def quarantine(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "quarantined", label=Step.Label.QUARANTINED)

    @admin.action(
        description="Clear the label of every step of selected trajectories", permissions=["change"]
    )
    def clear_label(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._label(request, queryset, "cleared the label of", label=Step.Label.NONE)

    def _label(self, request: HttpRequest, queryset: QuerySet, verb: str, **change: Any) -> None:
        _label_with(
            self,
            request,
            lambda **kw: trajectories_label(
                trajectory_ids=queryset.order_by().values_list("id", flat=True), **kw
            ),
            verb,
            "steps of the selected trajectories",
            **change,
        )


@admin.register(PromptGroup)
class PromptGroupAdmin(ReplicaChangelist, admin.ModelAdmin):
    list_display = (
        "uid",
        "status",
        "expected_rollouts",
        "dataset",
        "created_at",
        "completed_at",
        "ready_at",
    )
    list_filter = ("status", GroupReadyFilter, "dataset")
    search_fields = ("uid",)
    raw_id_fields = ("anchor_step",)
    list_per_page = 100
    show_full_result_count = False


# --- helpers ------------------------------------------------------------------------------------
def _label_with(
    model_admin: admin.ModelAdmin,
    request: HttpRequest,
    service: Callable[..., int],
    verb: str,
    what: str,
    **change: Any,
) -> None:
    """Run a label service as the signed-in user and report what it changed."""
    try:
        changed = service(actor=request.user.get_username(), user_id=request.user.pk, **change)
    except PoolError as exc:
        model_admin.message_user(request, f"Nothing changed: {exc.message}", messages.ERROR)
        return
    model_admin.message_user(request, f"{verb.capitalize()} {what}: {changed} steps changed.")


def _full_ids(obj: Step):
    """The step's full sequence (prompt + response ids), rebuilt once per page."""
    ids = getattr(obj, "_admin_ids", None)
    if ids is None:
        ids = tokens.bytes_to_ids(tokens.load_sequences([obj.pk])[obj.pk])
        obj._admin_ids = ids  # type: ignore[attr-defined]
    return ids


def _ids_html(ids) -> str:
    n = len(ids)
    if n <= 2 * IDS_SHOWN:
        body = " ".join(map(str, ids.tolist()))
        head = f"{n} ids"
    else:
        first = " ".join(map(str, ids[:IDS_SHOWN].tolist()))
        last = " ".join(map(str, ids[-IDS_SHOWN:].tolist()))
        body = f"{first}\n… {n - 2 * IDS_SHOWN} ids not shown …\n{last}"
        head = f"{n} ids (first and last {IDS_SHOWN} shown)"
    return format_html("<div>{}</div>{}", head, _pre(body))


def _text_html(text: str) -> str:
    if len(text) > TEXT_SHOWN:
        text = f"{text[:TEXT_SHOWN]}\n… {len(text) - TEXT_SHOWN} more characters not shown"
    return _pre(text)


def _pre(text: str) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap; max-height: 24em; overflow: auto; margin: 0">{}</pre>', text
    )


def _history_html(rows) -> str:
    html = format_html_join("", "<li>{} · {} · {}</li>", rows)
    return format_html("<ul>{}</ul>", html) if html else "none"
