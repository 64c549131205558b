"""Admin of curation: datasets and their versions, review queues and claims, the label audit
and step tags.

Every page here is read-only. Datasets and queues are written by their services (new
versions, normalised specs), labels and tags by the step actions (curation/admin/steps.py),
so the admin can never write a row that skips its audit or its version.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html

from pool.replica import ReplicaChangelist

from ..models import Dataset, DatasetVersion, LabelEvent, ReviewClaim, ReviewQueue, StepTag


class ReadOnlyAdmin(ReplicaChangelist, admin.ModelAdmin):
    list_per_page = 100
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DatasetVersionInline(admin.TabularInline):
    model = DatasetVersion
    fields = ("version", "created_by", "created_at", "spec_display")
    readonly_fields = fields
    ordering = ("-version",)
    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="spec")
    def spec_display(self, obj: DatasetVersion) -> str:
        return pretty_json(obj.spec)


@admin.register(Dataset)
class DatasetAdmin(ReadOnlyAdmin):
    list_display = ("name", "current_version", "description", "updated_at")
    search_fields = ("name",)
    list_select_related = ("current",)
    fields = ("name", "description", "current_version", "current_spec", "created_at", "updated_at")
    readonly_fields = fields
    inlines = (DatasetVersionInline,)

    @admin.display(description="current version", ordering="current__version")
    def current_version(self, obj: Dataset) -> int | None:
        return obj.current.version if obj.current_id else None

    @admin.display(description="current spec")
    def current_spec(self, obj: Dataset) -> str:
        return pretty_json(obj.current.spec) if obj.current_id else "-"


@admin.register(DatasetVersion)
class DatasetVersionAdmin(ReadOnlyAdmin):
    list_display = ("dataset", "version", "created_by", "created_at")
    list_filter = ("dataset",)
    list_select_related = ("dataset",)
    ordering = ("dataset__name", "-version")
    fields = ("dataset", "version", "created_by", "created_at", "spec_display")
    readonly_fields = fields

    @admin.display(description="spec")
    def spec_display(self, obj: DatasetVersion) -> str:
        return pretty_json(obj.spec)


@admin.register(ReviewQueue)
class ReviewQueueAdmin(ReadOnlyAdmin):
    list_display = ("name", "is_default", "dataset", "rating_min", "rating_max", "sets_reward", "created_at")
    list_select_related = ("dataset",)
    search_fields = ("name",)
    fields = (
        "name",
        "description",
        "is_default",
        "dataset",
        "filters_display",
        ("rating_min", "rating_max"),
        "label_choices",
        ("ask_correction", "sets_reward"),
        "claim_seconds",
        "created_at",
        ("mode", "group_reward"),
        ("reviews_per_item", "label_multi"),
        "guidelines",
    )
    # The guidelines alone can be edited here (words beside the item, no effect on data).
    readonly_fields = tuple(
        name for f in fields for name in (f if isinstance(f, tuple) else (f,)) if name != "guidelines"
    )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("pool.change_step")

    @admin.display(description="filters")
    def filters_display(self, obj: ReviewQueue) -> str:
        return pretty_json(obj.filters)


@admin.register(ReviewClaim)
class ReviewClaimAdmin(ReadOnlyAdmin):
    list_display = ("id", "queue", "trajectory", "user", "claimed_at", "expires_at", "done_at")
    list_filter = ("queue",)
    list_select_related = ("queue", "trajectory", "user")
    raw_id_fields = ("trajectory", "feedback")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("trajectory__metadata")


@admin.register(LabelEvent)
class LabelEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "step", "changes_display")
    list_filter = ("actor",)
    search_fields = ("step__uid", "actor")
    list_select_related = ("step",)
    ordering = ("-created_at", "-id")
    fields = ("created_at", "actor", "user", "step", "changes_display")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # The step's uid only: its blobs and text are megabytes a list of changes never shows.
        return (
            super()
            .get_queryset(request)
            .select_related("step")
            .only("id", "created_at", "actor", "user", "changes", "step", "step__uid")
        )

    @admin.display(description="changes")
    def changes_display(self, obj: LabelEvent) -> str:
        return json.dumps(obj.changes, ensure_ascii=False)


@admin.register(StepTag)
class StepTagAdmin(ReadOnlyAdmin):
    list_display = ("tag", "step", "created_at")
    list_filter = ("tag",)
    search_fields = ("tag", "step__uid")
    list_select_related = ("step",)

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return (
            super()
            .get_queryset(request)
            .select_related("step")
            .only("id", "tag", "created_at", "step", "step__uid")
        )


def pretty_json(value: Any) -> str:
    return format_html(
        '<pre style="white-space: pre-wrap; margin: 0">{}</pre>',
        json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False),
    )
