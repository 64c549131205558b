"""Rewards set on steps and trajectories after the fact."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from pool.access.auth import (
    IngestScope,
    source_id_of,
    write_sources_of,
)
from pool.services.rewards import RewardIn, rewards_apply

from .. import serializers as s
from .common import _one_or_many


# --- rewards, events, feedback, policy versions ------------------------------------------------
class RewardApi(APIView):
    permission_classes = [IngestScope]

    @extend_schema(
        request=s.RewardBatchSerializer,
        responses={200: inline_serializer("RewardResult", {"applied": serializers.IntegerField()})},
        summary="Late rewards for steps or trajectories (a single object or {'rewards': [...]})",
    )
    def post(self, request):
        data, _ = _one_or_many(request.data, "rewards")
        ser = s.RewardBatchSerializer(data=data)
        ser.is_valid(raise_exception=True)
        items = [
            RewardIn(
                reward=r["reward"],
                step_uid=r.get("step_uid"),
                trajectory_uid=r.get("trajectory_uid"),
                source=r["source"],
                final=r["final"],
                metadata=r.get("metadata") or {},
                field_prefix=f"rewards[{i}].",
            )
            for i, r in enumerate(ser.validated_data["rewards"])
        ]
        events = rewards_apply(
            rewards=items, source_id=source_id_of(request), sources=write_sources_of(request)
        )
        return Response({"applied": len(events), "received": len(items)})
