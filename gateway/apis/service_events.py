"""What black-box services tell: live events and feedback."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import generics, serializers
from rest_framework.response import Response

from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    read_sources_of,
    source_id_of,
    user_id_of,
    write_sources_of,
)
from pool.replica import replica_handler
from pool.selectors.service_events import event_render, events_listed, feedback_listed, feedback_render
from pool.services.service_events import EventIn, event_record, feedback_create

from .. import serializers as s
from ..filters import EventFilter, FeedbackFilter
from .common import _methods_scope, _one_or_many


class EventApi(KnownQueryParams, generics.GenericAPIView):
    filterset_class = EventFilter

    def get_queryset(self):
        return events_listed(read_sources_of(self.request))

    def get_permissions(self):
        return _methods_scope(self.request)

    @extend_schema(
        request=s.EventBatchSerializer,
        responses={201: inline_serializer("EventResult", {"recorded": serializers.IntegerField()})},
        summary="Service events (a single object or {'events': [...]})",
    )
    def post(self, request):
        data, _ = _one_or_many(request.data, "events")
        ser = s.EventBatchSerializer(data=data)
        ser.is_valid(raise_exception=True)
        items = [
            EventIn(field_prefix=f"events[{i}].", **e) for i, e in enumerate(ser.validated_data["events"])
        ]
        rows = event_record(events=items, source_id=source_id_of(request), sources=write_sources_of(request))
        return Response({"recorded": len(rows), "ids": [r.id for r in rows]}, status=201)

    @extend_schema(responses=s.EventReadSerializer(many=True), summary="List events (cursor-paginated)")
    @replica_handler
    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([event_render(e) for e in page])


class FeedbackApi(KnownQueryParams, generics.GenericAPIView):
    filterset_class = FeedbackFilter

    def get_queryset(self):
        return feedback_listed(read_sources_of(self.request))

    def get_permissions(self):
        return _methods_scope(self.request)

    @extend_schema(
        request=s.FeedbackSerializer,
        responses={201: inline_serializer("FeedbackResult", {"id": serializers.IntegerField()})},
    )
    def post(self, request):
        ser = s.FeedbackSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        fb = feedback_create(
            **ser.validated_data,
            source_id=source_id_of(request),
            user_id=user_id_of(request),
            sources=write_sources_of(request),
        )
        return Response({"id": fb.id}, status=201)

    @extend_schema(responses=s.FeedbackReadSerializer(many=True), summary="List feedback (cursor-paginated)")
    @replica_handler
    def get(self, request):
        page = self.paginate_queryset(self.filter_queryset(self.get_queryset()))
        return self.get_paginated_response([feedback_render(f) for f in page])
