"""Request/response serializers.

Steps are validated by gateway/validation.py (bulk, numpy) for speed; StepWriteSerializer
documents the same contract in the OpenAPI schema, and a test keeps the two in sync. The
low-volume endpoints validate with these serializers directly.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from pool.models import Channel, Step, Trajectory

from .validation import INT32_MAX, INT64_MAX, json_problem


class StrictSerializer(serializers.Serializer):
    """Rejects unknown fields, naming them."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                name = sorted(unknown)[0]
                raise serializers.ValidationError({name: [f"unknown field {name!r}"]})
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only: no strings, floats or booleans (DRF coerces "3" and 3.0)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError("must be an integer")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean only (DRF accepts "yes", 1, "on", ...)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("must be a boolean")
        return data


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


class FiniteFloatField(serializers.FloatField):
    """A finite JSON number (no strings, booleans, NaN or infinities)."""

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise serializers.ValidationError("must be a number")
        value = super().to_internal_value(data)
        if value != value or value in (float("inf"), float("-inf")):
            raise serializers.ValidationError("must be a finite number")
        return value


# --- steps (schema only; validated in bulk by gateway.validation) ---------------------------
class StepWriteSerializer(StrictSerializer):
    uid = serializers.CharField(
        required=False, max_length=128, help_text="Idempotency key. Default: '<trajectory_uid>:<step_index>'."
    )
    trajectory_uid = serializers.CharField(max_length=128)
    prompt_group_uid = serializers.CharField(required=False, allow_null=True, max_length=128)
    step_index = serializers.IntegerField(min_value=0)
    prompt_ids = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=2**31 - 1))
    response_ids = serializers.ListField(child=serializers.IntegerField(min_value=0, max_value=2**31 - 1))
    rollout_logprobs = serializers.ListField(child=serializers.FloatField(), required=False, allow_null=True)
    reward = FiniteFloatField(required=False, allow_null=True)
    reward_source = serializers.ChoiceField(
        choices=Step.RewardSource.choices, required=False, allow_null=True
    )
    policy_version = serializers.IntegerField(min_value=0, required=False, allow_null=True)
    is_last = serializers.BooleanField(required=False, default=False)
    finish_reason = serializers.CharField(required=False, allow_null=True, max_length=32)
    messages = serializers.ListField(child=serializers.DictField(), required=False, allow_null=True)
    response_text = serializers.CharField(required=False, allow_null=True, allow_blank=True)
    metadata = serializers.DictField(required=False)


class StepBatchSerializer(serializers.Serializer):
    steps = StepWriteSerializer(many=True)


class StepReadSerializer(StepWriteSerializer):
    reward_status = serializers.ChoiceField(choices=Step.RewardStatus.choices)
    token_source = serializers.ChoiceField(choices=Step.TokenSource.choices)
    drift = serializers.BooleanField()
    drift_offset = serializers.IntegerField(allow_null=True)
    created_at = serializers.DateTimeField()


class StepIngestResultSerializer(serializers.Serializer):
    created = serializers.IntegerField()
    duplicates = serializers.IntegerField()
    steps = serializers.ListField(child=serializers.DictField())


# --- trajectories, groups -------------------------------------------------------------------
class TrajectoryCreateSerializer(StrictSerializer):
    uid = serializers.CharField(max_length=128, required=False)
    prompt_group_uid = serializers.CharField(max_length=128, required=False, allow_null=True)
    channel = serializers.ChoiceField(choices=Channel.choices, default=Channel.TRAIN)
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


class GroupUpsertSerializer(StrictSerializer):
    uid = serializers.CharField(max_length=128)
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
    step_uid = serializers.CharField(required=False, max_length=160)
    trajectory_uid = serializers.CharField(required=False, max_length=128)
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
    trajectory_uid = serializers.CharField(required=False, max_length=128)
    step_uid = serializers.CharField(required=False, max_length=160)
    occurred_at = serializers.DateTimeField(required=False)


class EventBatchSerializer(StrictSerializer):
    events = EventSerializer(many=True, allow_empty=False, max_length=10_000)


class FeedbackSerializer(StrictSerializer):
    step_uid = serializers.CharField(required=False, max_length=160)
    trajectory_uid = serializers.CharField(required=False, max_length=128)
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


class PolicyVersionSerializer(StrictSerializer):
    version = StrictIntegerField(min_value=0, max_value=INT64_MAX)
    current = StrictBooleanField(default=True)
    metadata = SafeDictField(required=False)
