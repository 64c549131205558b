"""Admin for the pool's operational rows: sources, keys, policy versions, reward and event
audit, feedback, merge results and capability tokens."""

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from .models import (
    ApiKey,
    AuditEvent,
    Event,
    Feedback,
    MergeResult,
    PolicyVersion,
    RewardEvent,
    RewardFailure,
    RewardFunction,
    Source,
    Task,
    TaskSampleRecord,
    TaskSet,
    TrajectoryCapability,
)
from .replica import ReplicaChangelist
from .rewards.base import RewardError
from .rewards.registry import load
from .services.api_keys import api_key_revoke


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "created_at")
    search_fields = ("name",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "source", "scopes", "created_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at")
    list_filter = ("revoked_at",)
    actions = ["revoke"]

    @admin.action(description="Revoke selected API keys")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        for prefix in queryset.values_list("prefix", flat=True):
            api_key_revoke(prefix=prefix, actor=f"user:{request.user.get_username()}")
        self.message_user(request, f"revoked {queryset.count()} key(s)")


@admin.register(AuditEvent)
class AuditEventAdmin(ReplicaChangelist, admin.ModelAdmin):
    """Read-only: the audit log is written by the services only."""

    list_display = ("created_at", "action", "target", "actor")
    list_filter = ("action",)
    search_fields = ("target", "actor")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    list_display = ("version", "is_current", "created_at")


class TargetedAdmin(ReplicaChangelist, admin.ModelAdmin):
    """Lists of rows about a step or a trajectory (rewards, events, feedback): the target in
    the same query, heavy columns left behind, no full count."""

    list_select_related = ("step", "trajectory")
    list_per_page = 100
    show_full_result_count = False

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return with_targets(super().get_queryset(request))


@admin.register(RewardEvent)
class RewardEventAdmin(TargetedAdmin):
    list_display = (
        "id",
        "step",
        "trajectory",
        "old_reward",
        "new_reward",
        "reward_source",
        "final",
        "created_at",
    )
    list_filter = ("reward_source", "final")
    raw_id_fields = ("step", "trajectory", "source")


@admin.register(Event)
class EventAdmin(TargetedAdmin):
    list_display = ("id", "type", "trajectory", "step", "created_at")
    list_filter = ("type",)
    raw_id_fields = ("trajectory", "step", "source")


@admin.register(Feedback)
class FeedbackAdmin(TargetedAdmin):
    list_display = ("id", "step", "trajectory", "rating", "label", "author", "created_at")
    list_filter = ("label",)
    search_fields = ("step__uid", "trajectory__uid", "author")
    raw_id_fields = ("trajectory", "step", "source", "user")


@admin.register(MergeResult)
class MergeResultAdmin(ReplicaChangelist, admin.ModelAdmin):
    list_display = (
        "key",
        "status",
        "n_sequences",
        "total_tokens",
        "unique_tokens",
        "savings_display",
        "updated_at",
    )
    list_filter = ("status",)
    search_fields = ("key",)
    raw_id_fields = ("group",)
    exclude = ("layout", "input_hash")
    # Results are computed by the merge tasks; editing them by hand would only desynchronise them.
    readonly_fields = (
        "key",
        "group",
        "status",
        "n_sequences",
        "total_tokens",
        "unique_tokens",
        "savings_display",
        "ratio_display",
        "layout_size",
        "stats",
        "error",
        "created_at",
        "updated_at",
    )

    @admin.display(description="savings")
    def savings_display(self, obj: MergeResult) -> str:
        return f"{obj.savings:.1%}"

    @admin.display(description="unique / total")
    def ratio_display(self, obj: MergeResult) -> str:
        return f"{obj.ratio:.4f}"

    @admin.display(description="stored layout")
    def layout_size(self, obj: MergeResult) -> str:
        return f"{len(obj.layout):,} bytes" if obj.layout else "-"


@admin.register(TrajectoryCapability)
class TrajectoryCapabilityAdmin(admin.ModelAdmin):
    """Tokens of capability URLs: which trajectory, which issuing key, until when. The clear
    token is never stored, and its hash is not shown. Deleting a row revokes its URL."""

    list_display = ("id", "trajectory", "api_key", "created_at", "expires_at")
    exclude = ("token_hash",)
    readonly_fields = ("trajectory", "api_key", "created_at")
    list_select_related = ("trajectory", "api_key")

    def has_add_permission(self, request) -> bool:
        return False  # tokens are minted by init_trajectory / POST /api/v1/trajectories only


# Columns of a step or trajectory a row about it never shows (blobs, JSON, free text).
_TARGET_HEAVY = (
    *(
        f"step__{f}"
        for f in (
            "seq_delta",
            "rollout_logprobs",
            "seq_hash",
            "content_hash",
            "messages",
            "response_text",
            "metadata",
        )
    ),
    "trajectory__metadata",
)


def with_targets(qs: QuerySet) -> QuerySet:
    """Rows about a step or a trajectory (rewards, events, feedback) with their target in the
    same query, its heavy columns left behind: a list page costs the same for 10 or 100 rows."""
    return qs.select_related("step", "trajectory").defer(*_TARGET_HEAVY)


@admin.register(RewardFunction)
class RewardFunctionAdmin(admin.ModelAdmin):
    """Reward functions by data source or dataset (pool/rewards/); a row overrides
    settings.CLAW_REWARD_FUNCTIONS for its name, a disabled one switches the name off."""

    list_display = ("name", "path", "enabled", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("name", "path")

    def get_form(self, request: HttpRequest, obj=None, change: bool = False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)

        def clean_path(self) -> str:
            path = self.cleaned_data["path"]
            try:
                load(path)
            except RewardError as e:
                raise ValidationError(str(e)) from None
            return path

        form.clean_path = clean_path
        return form


@admin.register(RewardFailure)
class RewardFailureAdmin(ReplicaChangelist, admin.ModelAdmin):
    """Computed rewards that could not be made, with the error (pool/services/reward_compute.py)."""

    list_display = ("id", "trajectory", "step", "data_source", "function", "error", "attempts", "updated_at")
    list_filter = ("data_source",)
    list_select_related = ("trajectory", "step")
    search_fields = ("trajectory__uid", "error")
    raw_id_fields = ("trajectory", "step")
    readonly_fields = ("created_at", "updated_at")
    show_full_result_count = False


# --- tasks: sets (thresholds editable), tasks and the sampler's records (read-only) -----------------
@admin.register(TaskSet)
class TaskSetAdmin(admin.ModelAdmin):
    """A set's pass threshold and recent window (half-life in policy versions); a change
    applies to groups counted after it (pool/services/task_stats.py)."""

    list_display = ("name", "pass_threshold", "window", "created_at")
    search_fields = ("name",)


@admin.register(Task)
class TaskAdmin(ReplicaChangelist, admin.ModelAdmin):
    """Tasks with their statistics; the statistics are the write pipeline's (read-only)."""

    list_display = (
        "uid",
        "set_name",
        "source",
        "seen",
        "pass_rate",
        "recent_pass_rate",
        "informative_groups",
    )
    list_filter = ("set_name",)
    search_fields = ("uid",)
    show_full_result_count = False
    readonly_fields = tuple(
        f.name for f in Task._meta.fields if f.name not in ("set_name", "prompt", "ground_truth", "metadata")
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # registration is POST /api/v1/tasks or manage.py import_tasks


@admin.register(TaskSampleRecord)
class TaskSampleRecordAdmin(ReplicaChangelist, admin.ModelAdmin):
    """Every answer of the task sampler, for audit (read-only)."""

    list_display = ("id", "strategy", "source", "api_key", "created_at")
    list_filter = ("strategy",)
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False
