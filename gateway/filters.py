"""django-filter FilterSets for the list endpoints. Each filter maps onto an indexed column."""

from datetime import UTC

import django_filters as df
from django.core.exceptions import ValidationError

from pool.models import Event, Feedback, PromptGroup, Step, Trajectory


class UtcIsoDateTimeField(df.fields.IsoDateTimeField):
    """An ISO 8601 datetime converted to UTC: PostgreSQL refuses offsets beyond +-15:59 that
    the parser accepts (a 500 otherwise), and a date pushed past year 9999 is a 400."""

    def to_python(self, value):
        parsed = super().to_python(value)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        try:
            return parsed.astimezone(UTC)
        except OverflowError:
            raise ValidationError("date and time out of range", code="invalid") from None


class UtcIsoDateTimeFilter(df.IsoDateTimeFilter):
    field_class = UtcIsoDateTimeField


class StepFilter(df.FilterSet):
    trajectory_uid = df.CharFilter(field_name="trajectory__uid")
    prompt_group_uid = df.CharFilter(field_name="trajectory__group__uid")
    policy_version = df.NumberFilter(field_name="policy_version_id")
    policy_version_min = df.NumberFilter(field_name="policy_version_id", lookup_expr="gte")
    reward_status = df.ChoiceFilter(choices=Step.RewardStatus.choices)
    reward_source = df.ChoiceFilter(choices=Step.RewardSource.choices)
    token_source = df.ChoiceFilter(choices=Step.TokenSource.choices)
    drift = df.BooleanFilter()
    is_last = df.BooleanFilter()
    created_after = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = UtcIsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Step
        fields: list[str] = []


class TrajectoryFilter(df.FilterSet):
    prompt_group_uid = df.CharFilter(field_name="group__uid")
    status = df.ChoiceFilter(choices=Trajectory.Status.choices)
    channel = df.CharFilter()
    policy_version = df.NumberFilter(field_name="policy_version_id")

    class Meta:
        model = Trajectory
        fields: list[str] = []


class GroupFilter(df.FilterSet):
    status = df.ChoiceFilter(choices=PromptGroup.Status.choices)
    dataset = df.CharFilter()

    class Meta:
        model = PromptGroup
        fields: list[str] = []


class EventFilter(df.FilterSet):
    type = df.CharFilter()
    trajectory_uid = df.CharFilter(field_name="trajectory__uid")

    class Meta:
        model = Event
        fields: list[str] = []


class FeedbackFilter(df.FilterSet):
    label = df.CharFilter()
    step_uid = df.CharFilter(field_name="step__uid")
    trajectory_uid = df.CharFilter(field_name="trajectory__uid")

    class Meta:
        model = Feedback
        fields: list[str] = []
