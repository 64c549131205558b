"""Admin for the pool: read-mostly views with the filters operators use."""

from django.contrib import admin

from .models import (
    ApiKey,
    Event,
    Feedback,
    MergeResult,
    PolicyVersion,
    PromptGroup,
    RewardEvent,
    Source,
    Step,
    Trajectory,
    TrajectoryCapability,
)


@admin.register(Source)
class SourceAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "created_at")
    search_fields = ("name",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "source", "scopes", "created_at", "revoked_at")
    readonly_fields = ("prefix", "key_hash", "created_at")
    list_filter = ("revoked_at",)


@admin.register(PolicyVersion)
class PolicyVersionAdmin(admin.ModelAdmin):
    list_display = ("version", "is_current", "created_at")


@admin.register(PromptGroup)
class PromptGroupAdmin(admin.ModelAdmin):
    list_display = ("uid", "status", "expected_rollouts", "dataset", "created_at", "completed_at")
    list_filter = ("status", "dataset")
    search_fields = ("uid",)
    raw_id_fields = ("anchor_step",)


@admin.register(Trajectory)
class TrajectoryAdmin(admin.ModelAdmin):
    list_display = (
        "uid",
        "group",
        "status",
        "channel",
        "reward",
        "step_count",
        "policy_version",
        "created_at",
    )
    list_filter = ("status", "channel", "policy_version")
    search_fields = ("uid", "group__uid")
    raw_id_fields = ("group", "source")
    list_select_related = ("group",)


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = (
        "uid",
        "trajectory",
        "step_index",
        "seq_len",
        "reward",
        "reward_status",
        "token_source",
        "drift",
        "policy_version",
        "created_at",
    )
    list_filter = ("reward_status", "reward_source", "token_source", "drift", "is_last", "policy_version")
    search_fields = ("uid", "trajectory__uid")
    raw_id_fields = ("trajectory", "seq_parent", "source")
    exclude = ("seq_delta", "rollout_logprobs", "seq_hash", "content_hash")
    list_select_related = ("trajectory",)
    show_full_result_count = False


@admin.register(RewardEvent)
class RewardEventAdmin(admin.ModelAdmin):
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
    raw_id_fields = ("step", "trajectory", "source")


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("id", "type", "trajectory", "step", "created_at")
    list_filter = ("type",)
    raw_id_fields = ("trajectory", "step", "source")


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    list_display = ("id", "step", "trajectory", "rating", "label", "author", "created_at")
    list_filter = ("label",)
    raw_id_fields = ("trajectory", "step", "source", "user")


@admin.register(MergeResult)
class MergeResultAdmin(admin.ModelAdmin):
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
