"""Steps: white-box batches in (JSON or MessagePack), the step list and one step out."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
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
from pool.errors import InvalidInput
from pool.ingest.pipeline import steps_ingest
from pool.replica import replica_handler
from pool.selectors.steps import step_get, steps_listed, steps_render

from .. import serializers as s
from ..filters import StepFilter
from ..parsers import StepBatchMsgpackParser, StepBatchParser
from .common import _found, _methods_scope


# --- steps ----------------------------------------------------------------------------------
class StepListCreateApi(KnownQueryParams, generics.GenericAPIView):
    filterset_class = StepFilter
    parser_classes = [StepBatchParser, StepBatchMsgpackParser]

    def get_queryset(self):
        return steps_listed(read_sources_of(self.request))

    def get_permissions(self):
        return _methods_scope(self.request)

    @extend_schema(
        request=s.StepBatchSerializer,
        responses={201: s.StepIngestResultSerializer, 200: s.StepIngestResultSerializer},
        summary="Submit a batch of steps (atomic, idempotent by uid)",
    )
    def post(self, request):
        batch = request.data  # list[StepIn], validated by StepBatchParser
        if not isinstance(batch, list):  # no body at all: DRF hands over an empty QueryDict
            raise InvalidInput('empty body; expected {"steps": [...]}', field="steps")
        result = steps_ingest(steps=batch, source_id=source_id_of(request), sources=write_sources_of(request))
        created = set(result.created_uids)
        body = {
            "created": len(result.created),
            "duplicates": len(result.duplicates),
            "steps": [
                {"uid": st.uid, "status": "created" if st.uid in created else "duplicate"} for st in batch
            ],
        }
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses=s.StepReadSerializer(many=True), summary="List steps (cursor-paginated)")
    @replica_handler
    def get(self, request):
        qs = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(qs)
        return self.get_paginated_response(steps_render(page))


class StepDetailApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(responses=s.StepReadSerializer, summary="One step, exactly as written")
    def get(self, request, uid: str):
        return Response(steps_render([_found(step_get(uid=uid, sources=read_sources_of(request)))])[0])
