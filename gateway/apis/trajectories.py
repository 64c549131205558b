"""Trajectories: created, listed, read, and completed (one or many at once)."""

from __future__ import annotations

import uuid
from urllib.parse import quote

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    IngestScope,
    ReadScope,
    key_id_of,
    read_sources_of,
    source_id_of,
    write_sources_of,
)
from pool.replica import replica_handler
from pool.selectors.trajectories import (
    trajectories_listed,
    trajectory_get,
    trajectory_render,
)
from pool.services.capabilities import trajectory_create_with_capability
from pool.services.trajectories import CompletionIn, trajectories_complete, trajectory_complete

from .. import serializers as s
from ..filters import TrajectoryFilter
from .common import _found, _methods_scope


# --- trajectories ---------------------------------------------------------------------------
class TrajectoryListCreateApi(KnownQueryParams, generics.GenericAPIView):
    filterset_class = TrajectoryFilter

    def get_queryset(self):
        return trajectories_listed(read_sources_of(self.request))

    def get_permissions(self):
        return _methods_scope(self.request)

    @extend_schema(
        request=s.TrajectoryCreateSerializer,
        responses={201: s.TrajectoryOpenedSerializer, 200: s.TrajectoryOpenedSerializer},
        summary="Create a trajectory (idempotent by uid) and get a capability base URL for its agent",
    )
    def post(self, request):
        ser = s.TrajectoryCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        d = ser.validated_data
        uid, group = d.get("uid") or uuid.uuid4().hex, d.get("prompt_group_uid")
        # A capability URL holds the uids as path segments, which cannot contain '/'.
        addressable = "/" not in uid and "/" not in (group or "")
        traj, created, token = trajectory_create_with_capability(
            uid=uid,
            prompt_group_uid=group,
            channel=d["channel"],
            metadata=d.get("metadata"),
            policy_version=d.get("policy_version"),
            source_id=source_id_of(request),
            sources=write_sources_of(request),
            api_key_id=key_id_of(request) if addressable else None,
        )
        traj = _found(trajectory_get(id=traj.id))
        body = trajectory_render(traj)
        body["base_url"] = None
        if token is not None:
            segments = "/".join(
                quote(part, safe="") for part in (token, traj.uid, body["prompt_group_uid"] or "-")
            )
            body["base_url"] = request.build_absolute_uri(f"/t/c/{segments}/v1")
        return Response(body, status=201 if created else 200)

    @extend_schema(responses=s.TrajectorySerializer(many=True))
    @replica_handler
    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([trajectory_render(t) for t in page])


class TrajectoryDetailApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(responses=s.TrajectorySerializer)
    def get(self, request, uid: str):
        return Response(trajectory_render(_found(trajectory_get(uid=uid, sources=read_sources_of(request)))))


class TrajectoryCompleteApi(APIView):
    permission_classes = [IngestScope]

    @extend_schema(request=s.TrajectoryCompleteSerializer, responses=s.TrajectorySerializer)
    def post(self, request, uid: str):
        ser = s.TrajectoryCompleteSerializer(data=request.data if request.body else {})
        ser.is_valid(raise_exception=True)
        d = ser.validated_data
        trajectory_complete(
            uid=uid,
            reward=d.get("reward"),
            status=d["status"],
            reward_source=d["reward_source"],
            source_id=source_id_of(request),
            sources=write_sources_of(request),
        )
        return Response(trajectory_render(_found(trajectory_get(uid=uid))))


class TrajectoryCompletionsApi(APIView):
    permission_classes = [IngestScope]

    @extend_schema(
        request=s.TrajectoryCompletionBatchSerializer,
        responses=inline_serializer("CompletionsResult", {"completed": serializers.IntegerField()}),
        summary="End many trajectories at once (all or none), with optional rewards",
    )
    def post(self, request):
        ser = s.TrajectoryCompletionBatchSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        items = [
            CompletionIn(
                uid=c["uid"],
                reward=c.get("reward"),
                status=c["status"],
                reward_source=c["reward_source"],
                field_prefix=f"completions[{i}].",
            )
            for i, c in enumerate(ser.validated_data["completions"])
        ]
        done = trajectories_complete(
            completions=items, source_id=source_id_of(request), sources=write_sources_of(request)
        )
        return Response({"completed": len(done)})
