"""Prompt groups: created, listed, read, and their prefix tree."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    ReadScope,
    read_sources_of,
    source_id_of,
    write_sources_of,
)
from pool.errors import NotFound
from pool.replica import replica_handler
from pool.selectors.trajectories import (
    group_get,
    group_render,
    groups_listed,
)
from pool.services.groups import group_upsert
from pool.services.merge import group_merge_ensure, merge_tree_render

from .. import serializers as s
from ..filters import GroupFilter
from .common import _found, _methods_scope


# --- groups ---------------------------------------------------------------------------------
class GroupListCreateApi(KnownQueryParams, generics.GenericAPIView):
    filterset_class = GroupFilter

    def get_queryset(self):
        return groups_listed(read_sources_of(self.request))

    def get_permissions(self):
        return _methods_scope(self.request)

    @extend_schema(request=s.GroupUpsertSerializer, responses=s.GroupSerializer)
    def post(self, request):
        ser = s.GroupUpsertSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        group = group_upsert(
            **ser.validated_data, source_id=source_id_of(request), sources=write_sources_of(request)
        )
        return Response(group_render(group))

    @extend_schema(responses=s.GroupSerializer(many=True))
    @replica_handler
    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([group_render(g) for g in page])


class GroupDetailApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(responses=s.GroupSerializer)
    def get(self, request, uid: str):
        return Response(group_render(_found(group_get(uid=uid, sources=read_sources_of(request)))))


class GroupPrefixTreeApi(KnownQueryParams, APIView):
    """The prefix-tree merge of a group: stats and radix nodes for visualisation.

    A current stored result is served as is. Without one, a group of up to
    MERGE_SYNC_MAX_TOKENS step tokens is merged during the request (milliseconds); a larger
    one answers 202 with status "pending" and its merge is enqueued.
    """

    permission_classes = [ReadScope]

    @extend_schema(
        responses={
            200: OpenApiResponse(description="status, total_tokens, unique_tokens, ratio, savings, nodes"),
            202: OpenApiResponse(description="merge enqueued: status 'pending', no nodes yet"),
        },
        summary="Prefix tree of a prompt group (token savings and radix nodes)",
    )
    def get(self, request, uid: str):
        # Its tree holds every rollout's tokens: a restricted reader sees only its own groups'.
        if group_get(uid=uid, sources=read_sources_of(request), shared=False) is None:
            raise NotFound(f"prompt group {uid!r} does not exist", field="uid")  # as for an unknown one
        result = group_merge_ensure(uid=uid)
        body = merge_tree_render(result)
        return Response(
            body, status=status.HTTP_202_ACCEPTED if result.status == "pending" else status.HTTP_200_OK
        )
