"""Request/response serializers.

Steps are validated by the step contract's msgspec structs (pool/ingest/contract.py, in C)
for speed; StepWriteSerializer is *derived* from that struct (``struct_serializer``), so the
OpenAPI schema documents exactly what the decoder accepts. The low-volume endpoints validate
with these serializers directly.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from claw_kit.web.serializers import (
    FiniteFloatField,
    StrictBooleanField,
    StrictIntegerField,
    StrictSerializer,
    struct_serializer,
)
from pool.flags import QUALITY_NAMES, READINESS_NAMES
from pool.ingest import rules
from pool.ingest.contract import StepWire
from pool.ingest.rules import INT32_MAX, INT64_MAX, json_problem
from pool.models import Channel, Step, Trajectory


def _raise_json_problem(value: Any) -> None:
    found = json_problem(value)
    if found:
        path, reason = found
        raise serializers.ValidationError({path: [reason]} if path else [reason])


class SafeDictField(serializers.DictField):
    """A JSON object that every database backend stores and the renderer writes back."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        _raise_json_problem(value)
        return value


class SafeJSONField(serializers.JSONField):
    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        _raise_json_problem(value)
        return value


# --- steps (schema only; derived from the contract's struct) ----------------------------------
StepWriteSerializer = struct_serializer(StepWire, "StepWriteSerializer")


class StepBatchSerializer(serializers.Serializer):
    steps = StepWriteSerializer(many=True)


def inline_image_ref() -> serializers.Serializer:
    return ImageRefSerializer()


class ImageRefSerializer(serializers.Serializer):
    """One image of a step as reads and batch formats carry it (pool.selectors.steps.step_images)."""

    sha256 = serializers.CharField(allow_null=True)
    media_type = serializers.CharField(allow_null=True)
    width = serializers.IntegerField(allow_null=True)
    height = serializers.IntegerField(allow_null=True)
    byte_size = serializers.IntegerField(allow_null=True)
    url = serializers.CharField()
    kind = serializers.ChoiceField(choices=["stored", "url"])
    message_index = serializers.IntegerField(allow_null=True)
    part_index = serializers.IntegerField(allow_null=True)
    token_start = serializers.IntegerField(allow_null=True)
    token_end = serializers.IntegerField(allow_null=True)


class MediaSerializer(serializers.Serializer):
    """POST /api/v1/media's answer: the stored image."""

    sha256 = serializers.CharField()
    media_type = serializers.CharField()
    width = serializers.IntegerField()
    height = serializers.IntegerField()
    byte_size = serializers.IntegerField()
    url = serializers.CharField()


class StepReadSerializer(StepWriteSerializer):  # type: ignore[valid-type,misc]
    # A read's reward and reward_source are the step's effective reward (its own, else its
    # branch's, else its trajectory's: pool/services/effective_reward.py).
    reward_status = serializers.ChoiceField(
        choices=Step.RewardStatus.choices, help_text="final: the effective reward is final"
    )
    reward_scope = serializers.ChoiceField(
        choices=Step.RewardScope.choices,
        allow_null=True,
        help_text="where the reward came from: the step's own, its branch's or its trajectory's",
    )
    outcome_reward = serializers.FloatField(
        allow_null=True,
        help_text="its branch's outcome: the own final reward of the branch's final step, else the "
        "trajectory's reward; null while there is none",
    )
    process_reward = serializers.FloatField(
        allow_null=True,
        help_text="its own reward when it is not its branch's final step (a reward of this step alone), else null",
    )
    token_source = serializers.ChoiceField(choices=Step.TokenSource.choices)
    drift = serializers.BooleanField()
    drift_offset = serializers.IntegerField(allow_null=True)
    branch = serializers.IntegerField(help_text="the branch of its trajectory (0: the first)")
    parent_step_uid = serializers.CharField(
        allow_null=True, help_text="the step this one continues or branched from (proxied calls)"
    )
    created_at = serializers.DateTimeField()
    ready = serializers.BooleanField(help_text="every readiness condition holds")
    readiness = serializers.ListField(
        child=serializers.ChoiceField(choices=list(READINESS_NAMES)), help_text="the conditions that hold"
    )
    quality_flags = serializers.ListField(child=serializers.ChoiceField(choices=list(QUALITY_NAMES)))
    label = serializers.ChoiceField(choices=[v for v in Step.Label.values if v], allow_null=True)
    images = serializers.ListField(
        child=inline_image_ref(),
        help_text="the step's images in order: stored ones by sha256 with their download url "
        "(GET /api/v1/media/<sha256>); kind 'url' for a remote image kept as a reference only",
    )


class StepIngestResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    duplicates = serializers.IntegerField()
    steps = serializers.ListField(child=serializers.DictField())


# --- trajectories, groups -------------------------------------------------------------------
class TrajectoryCreateSerializer(StrictSerializer):
    uid = serializers.CharField(max_length=rules.MAX_UID_LEN, required=False)
    prompt_group_uid = serializers.CharField(max_length=rules.MAX_UID_LEN, required=False, allow_null=True)
    channel = serializers.ChoiceField(choices=rules.CHANNELS, default=Channel.TRAIN)
    policy_version = StrictIntegerField(min_value=0, max_value=INT64_MAX, required=False, allow_null=True)
    metadata = SafeDictField(required=False)


class TrajectorySerializer(serializers.Serializer):
    uid = serializers.CharField()
    prompt_group_uid = serializers.CharField(allow_null=True)
    channel = serializers.CharField()
    status = serializers.ChoiceField(choices=Trajectory.Status.choices)
    reward = serializers.FloatField(allow_null=True)
    step_count = serializers.IntegerField()
    policy_version = serializers.IntegerField(allow_null=True)
    metadata = serializers.DictField()
    source = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)


class TrajectoryOpenedSerializer(TrajectorySerializer):
    """The answer to POST /api/v1/trajectories: the trajectory plus its capability URL."""

    base_url = serializers.CharField(
        allow_null=True,
        help_text=(
            "A capability base URL for OpenAI-compatible agents, "
            "`{site}/t/c/{token}/{trajectory_uid}/{prompt_group_uid or -}/v1`: its token alone "
            "authorises chat/completions, completions and models on this trajectory (no API key "
            "needed; an Authorization header is ignored), until the trajectory ends or "
            "CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS pass. A secret: every call mints a new one. "
            "Null for an operator session (no issuing key), a trajectory that is no longer "
            "running, or uids that cannot be URL path segments (containing '/')."
        ),
    )


class TrajectoryCompleteSerializer(StrictSerializer):
    reward = FiniteFloatField(required=False, allow_null=True)
    status = serializers.ChoiceField(
        choices=[Trajectory.Status.COMPLETED, Trajectory.Status.FAILED, Trajectory.Status.ABANDONED],
        default=Trajectory.Status.COMPLETED,
    )
    reward_source = serializers.ChoiceField(choices=Step.RewardSource.choices, default=Step.RewardSource.ENV)


class TrajectoryCompletionSerializer(TrajectoryCompleteSerializer):
    uid = serializers.CharField(max_length=rules.MAX_UID_LEN)


class TrajectoryCompletionBatchSerializer(StrictSerializer):
    completions = TrajectoryCompletionSerializer(many=True, allow_empty=False, max_length=10_000)


class GroupUpsertSerializer(StrictSerializer):
    uid = serializers.CharField(max_length=rules.MAX_UID_LEN)
    task = serializers.CharField(
        max_length=rules.MAX_UID_LEN, required=False
    )  # the task it rolls out (a uid)
    expected_rollouts = StrictIntegerField(min_value=1, max_value=INT32_MAX, required=False, allow_null=True)
    dataset = serializers.CharField(max_length=128, required=False, allow_blank=True)
    ground_truth = SafeJSONField(required=False, allow_null=True)
    metadata = SafeDictField(required=False)


class GroupSerializer(serializers.Serializer):
    uid = serializers.CharField()
    status = serializers.CharField()
    expected_rollouts = serializers.IntegerField(allow_null=True)
    dataset = serializers.CharField()
    ground_truth = serializers.JSONField(allow_null=True)
    metadata = serializers.DictField()
    created_at = serializers.DateTimeField()
    completed_at = serializers.DateTimeField(allow_null=True)


# --- rewards, events, feedback, policy --------------------------------------------------------
class RewardSerializer(StrictSerializer):
    step_uid = serializers.CharField(required=False, max_length=rules.MAX_STEP_UID_LEN)
    trajectory_uid = serializers.CharField(required=False, max_length=rules.MAX_UID_LEN)
    reward = FiniteFloatField()
    source = serializers.ChoiceField(choices=Step.RewardSource.choices, default=Step.RewardSource.ENV)
    final = StrictBooleanField(default=True)
    metadata = SafeDictField(required=False)

    def validate(self, attrs):
        if ("step_uid" in attrs) == ("trajectory_uid" in attrs):
            raise serializers.ValidationError(
                {"step_uid": ["give exactly one of step_uid or trajectory_uid"]}
            )
        return attrs


class RewardBatchSerializer(StrictSerializer):
    rewards = RewardSerializer(many=True, allow_empty=False, max_length=10_000)


class EventSerializer(StrictSerializer):
    type = serializers.CharField(max_length=64)
    payload = SafeDictField(required=False)
    trajectory_uid = serializers.CharField(required=False, max_length=rules.MAX_UID_LEN)
    step_uid = serializers.CharField(required=False, max_length=rules.MAX_STEP_UID_LEN)
    occurred_at = serializers.DateTimeField(required=False)


class EventBatchSerializer(StrictSerializer):
    events = EventSerializer(many=True, allow_empty=False, max_length=10_000)


class FeedbackSerializer(StrictSerializer):
    step_uid = serializers.CharField(required=False, max_length=rules.MAX_STEP_UID_LEN)
    trajectory_uid = serializers.CharField(required=False, max_length=rules.MAX_UID_LEN)
    rating = FiniteFloatField(required=False, allow_null=True)
    label = serializers.CharField(required=False, allow_blank=True, max_length=64)
    correction = serializers.CharField(required=False, allow_blank=True)
    comment = serializers.CharField(required=False, allow_blank=True)
    author = serializers.CharField(required=False, allow_blank=True, max_length=128)

    def validate(self, attrs):
        if ("step_uid" in attrs) == ("trajectory_uid" in attrs):
            raise serializers.ValidationError(
                {"step_uid": ["give exactly one of step_uid or trajectory_uid"]}
            )
        return attrs


class EventReadSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    type = serializers.CharField()
    payload = serializers.DictField()
    occurred_at = serializers.DateTimeField(allow_null=True)
    trajectory_uid = serializers.CharField(allow_null=True)
    step_uid = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()


class FeedbackReadSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    step_uid = serializers.CharField(allow_null=True)
    trajectory_uid = serializers.CharField(allow_null=True)
    rating = serializers.FloatField(allow_null=True)
    label = serializers.CharField()
    correction = serializers.CharField()
    comment = serializers.CharField()
    author = serializers.CharField()
    created_at = serializers.DateTimeField()


class PolicyVersionReadSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    is_current = serializers.BooleanField()
    metadata = serializers.DictField()


class TextField(serializers.CharField):
    """A JSON string only (DRF's CharField turns 7 into "7")."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a string")
        return super().to_internal_value(data)


class PolicyVersionSerializer(StrictSerializer):
    version = StrictIntegerField(min_value=0, max_value=INT64_MAX)
    current = StrictBooleanField(default=True)
    # Past the bounds (CLAW_POLICY_MAX_STEP, CLAW_POLICY_MAX_ADVANCE_PER_MINUTE) or backwards: admins only.
    force = StrictBooleanField(default=False)
    metadata = SafeDictField(required=False)
    # The policy whose current version moves (pool.models.Policy); none: "default".
    policy = TextField(required=False, default="default", max_length=64)
    # A training run's uid (POST /api/v1/runs): the version is also a checkpoint of that run.
    run = TextField(required=False, max_length=128)


# --- tasks and the task sampler (pool/services/task_catalog.py) ------------------------------
class TaskInSerializer(StrictSerializer):
    uid = TextField(max_length=rules.MAX_UID_LEN)
    set = TextField(max_length=128, required=False, allow_blank=True, default="")
    prompt = SafeJSONField(required=False, allow_null=True, default=None)
    ground_truth = SafeJSONField(required=False, allow_null=True, default=None)
    metadata = SafeDictField(required=False, default=dict)


class TaskRegisterSerializer(StrictSerializer):
    tasks = TaskInSerializer(many=True, allow_empty=False, max_length=10_000)


class TaskSamplerSerializer(StrictSerializer):
    tasks = SafeDictField(required=False, allow_null=True, default=None)  # GET /api/v1/tasks's filters
    n = StrictIntegerField(min_value=1, max_value=1_000, default=64)
    strategy = serializers.ChoiceField(choices=["uniform", "least_seen", "informative", "easy_to_hard"])
    seed = StrictIntegerField(min_value=0, max_value=INT64_MAX, required=False, allow_null=True, default=None)
    explore_below = StrictIntegerField(min_value=0, max_value=INT32_MAX, required=False, allow_null=True)
    explore_fraction = FiniteFloatField(min_value=0, max_value=1, required=False, allow_null=True)
    temperature = FiniteFloatField(min_value=0, max_value=100, required=False, allow_null=True)
    target = FiniteFloatField(min_value=0, max_value=1, required=False, allow_null=True)
