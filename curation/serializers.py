"""Schemas of the curation API (documentation: the specs themselves are parsed strictly by
curation/specs.py, whose structs these are derived from)."""

from __future__ import annotations

from rest_framework import serializers

from gateway.serializers import StrictSerializer, struct_serializer
from pool.models import Step

from .specs import Filters, Grouping

DatasetFiltersSerializer = struct_serializer(Filters, "DatasetFilters")
DatasetGroupingSerializer = struct_serializer(Grouping, "DatasetGrouping")


class DatasetSpecSerializer(StrictSerializer):
    filters = DatasetFiltersSerializer(required=False, help_text="empty: every ready step")
    grouping = DatasetGroupingSerializer(required=False)


class DatasetWriteSerializer(DatasetSpecSerializer):
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(required=False, allow_blank=True)


class DatasetVersionSerializer(serializers.Serializer):
    version = serializers.IntegerField()
    spec = DatasetSpecSerializer()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()


class DatasetSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    version = serializers.IntegerField(allow_null=True, help_text="the current version")
    filters = DatasetFiltersSerializer()
    grouping = DatasetGroupingSerializer()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    versions = DatasetVersionSerializer(many=True, required=False)


class PreviewSerializer(serializers.Serializer):
    steps = serializers.IntegerField(help_text="steps admitted (masked ones included)")
    masked_steps = serializers.IntegerField(help_text="steps of invalid rollouts served masked")
    trajectories = serializers.IntegerField()
    groups = serializers.IntegerField(allow_null=True)
    dropped_groups = serializers.IntegerField(help_text="complete groups with too few valid rollouts")
    waiting_units = serializers.IntegerField(help_text="groups not complete yet")
    prompt_tokens = serializers.IntegerField()
    response_tokens = serializers.IntegerField()
    mean_prompt_tokens = serializers.FloatField()
    mean_response_tokens = serializers.FloatField()
    current_policy_version = serializers.IntegerField(allow_null=True)


class LabelSerializer(StrictSerializer):
    step_uids = serializers.ListField(child=serializers.CharField(), required=False)
    trajectory_uids = serializers.ListField(child=serializers.CharField(), required=False)
    label = serializers.ChoiceField(
        choices=Step.Label.values, required=False, allow_null=True, help_text='"" clears the label'
    )
    tags_add = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    tags_remove = serializers.ListField(child=serializers.CharField(max_length=64), required=False)
    note = serializers.CharField(required=False, allow_blank=True, allow_null=True)
