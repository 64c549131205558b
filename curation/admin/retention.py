"""Admin of retention: policies (written here, by operators with the change permission) and
the archives their passes wrote (read-only).

Nothing goes without a look first: "Run now" shows each selected policy's dry run (what would
be archived and removed, and what its pins keep) on a confirmation page; only its confirm
button runs the pass."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from ..models import Archive, RetentionPolicy
from ..services.retention import retention_run
from .records import ReadOnlyAdmin


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    list_display = ("name", "action", "source", "dataset", "rules", "enabled", "last_run_at", "last_removed")
    list_filter = ("enabled", "action")
    search_fields = ("name",)
    readonly_fields = ("last_run_at", "last_report", "created_at")
    actions = ("run_now",)

    @admin.display(description="rules")
    def rules(self, obj: RetentionPolicy) -> str:
        parts = []
        if obj.older_than_days is not None:
            parts.append(f"older than {obj.older_than_days:g} days")
        if obj.keep_newest_steps is not None:
            parts.append(f"beyond the newest {obj.keep_newest_steps:,} steps")
        if obj.consumed:
            parts.append("consumed")
        return ", ".join(parts)

    @admin.display(description="last pass")
    def last_removed(self, obj: RetentionPolicy) -> str:
        r = obj.last_report or {}
        return f"{r.get('groups', 0)} groups, {r.get('steps', 0)} steps" if r else "-"

    @admin.action(description="Run now (a dry run first)", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[RetentionPolicy]) -> HttpResponse | None:
        if request.POST.get("confirm") == "yes":
            for policy in queryset:
                # unpaced (duty 1): the operator asked for it now and waits for the page
                r = retention_run(policy=policy, duty=1.0)
                self.message_user(
                    request,
                    f"{policy.name}: {r.groups} groups, {r.trajectories} trajectories, {r.steps} steps removed"
                    + (f" (archive {r.archive})" if r.archive else "")
                    + f"; {r.pinned} pinned kept",
                    messages.SUCCESS,
                )
            return None
        reports = [(p, retention_run(policy=p, dry_run=True)) for p in queryset]
        return TemplateResponse(
            request,
            "admin/curation/retention_confirm.html",
            {
                **self.admin_site.each_context(request),
                "title": "Run retention: what would go",
                "reports": reports,
                "queryset": queryset,
                "action": "run_now",
                "opts": self.model._meta,
            },
        )


@admin.register(Archive)
class ArchiveAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "policy_name",
        "groups",
        "trajectories",
        "steps",
        "files_count",
        "created_at",
        "restored_at",
    )
    search_fields = ("policy_name",)
    readonly_fields = (
        "id",
        "policy_name",
        "folder",
        "files",
        "steps",
        "groups",
        "trajectories",
        "created_at",
        "restored_at",
    )

    @admin.display(description="files")
    def files_count(self, obj: Archive) -> int:
        return len(obj.files)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).order_by("-created_at")
