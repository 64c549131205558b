"""Schemas of the curation API (documentation: the specs themselves are parsed strictly by
curation/specs.py, whose structs these are derived from)."""

from __future__ import annotations

from rest_framework import serializers

from claw_kit.web.serializers import StrictSerializer, struct_serializer

from .services.consume import PullIn
from .services.labels import LabelIn
from .services.snapshots import SnapshotIn
from .specs import Filters, Grouping, Serving

DatasetFiltersSerializer = struct_serializer(Filters, "DatasetFilters")
DatasetGroupingSerializer = struct_serializer(Grouping, "DatasetGrouping")
DatasetServingSerializer = struct_serializer(Serving, "DatasetServing")


class DatasetSpecSerializer(StrictSerializer):
    filters = DatasetFiltersSerializer(required=False, help_text="empty: every ready step")
    grouping = DatasetGroupingSerializer(required=False)
    serving = DatasetServingSerializer(required=False)


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
    serving = DatasetServingSerializer(allow_null=True)
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
    estimate = serializers.DictField(
        allow_null=True,
        help_text=(
            "null: counted exactly. Else the numbers are estimated from a sample of units "
            "(an unsaved spec's preview on a large pool): units_sampled, group_fraction and "
            "trajectory_fraction (the share of each kind drawn), margins (each figure's 95% margin)"
        ),
    )


LabelSerializer = struct_serializer(LabelIn, "Label")
PullSerializer = struct_serializer(PullIn, "Pull")


class ManifestSerializer(serializers.Serializer):
    lease_id = serializers.UUIDField()
    consumer = serializers.CharField()
    dataset = serializers.CharField()
    dataset_version = serializers.IntegerField()
    unit = serializers.CharField()
    format = serializers.CharField()
    units = serializers.IntegerField()
    step_uids = serializers.ListField(child=serializers.CharField())
    masked_steps = serializers.IntegerField()
    policy_versions = serializers.DictField(child=serializers.IntegerField(), help_text="version -> steps")
    current_policy_version = serializers.IntegerField(allow_null=True)
    staleness = serializers.DictField(
        allow_null=True, help_text="{min, max}: current version minus the steps'"
    )
    stale_steps = serializers.IntegerField(
        help_text="steps served that serving.stale_after calls stale (stale_mode serve; 0 under drop)"
    )
    content_hash = serializers.CharField(help_text="sha256 of the batch bytes")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()


class PullResultSerializer(serializers.Serializer):
    lease_id = serializers.UUIDField(allow_null=True, help_text="null: nothing ready for this consumer")
    manifest = ManifestSerializer(allow_null=True)
    batch = serializers.DictField(
        allow_null=True,
        help_text=(
            '{"steps": [...]} (each step read, with mask, staleness, versions_behind and '
            "token_versions_behind), or the padded or tree arrays with per-row uid, mask, staleness "
            "and versions_behind"
        ),
    )


class LeaseSerializer(serializers.Serializer):
    lease_id = serializers.UUIDField()
    status = serializers.CharField()
    units = serializers.IntegerField()
    steps = serializers.IntegerField()
    content_hash = serializers.CharField()
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    acked_at = serializers.DateTimeField(allow_null=True)


SnapshotCreateSerializer = struct_serializer(SnapshotIn, "SnapshotCreate")


class SnapshotSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    dataset = serializers.CharField()
    dataset_version = serializers.IntegerField()
    status = serializers.ChoiceField(choices=["pending", "building", "done", "failed"])
    progress = serializers.DictField(help_text="{steps_done, steps_total} (total null until frozen)")
    content_hash = serializers.CharField(help_text="sha256 of the JSONL file; empty until done")
    manifest = serializers.DictField(
        help_text="spec, counts, token statistics, policy versions, content hash, file sizes (once done)"
    )
    formats = serializers.ListField(child=serializers.CharField(), help_text="downloadable formats")
    error = serializers.CharField()
    created_by = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
