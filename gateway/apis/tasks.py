"""Tasks, their statistics, and the task sampler with its records."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.query import KnownQueryParams, decimal
from pool.access.auth import (
    ReadScope,
    key_id_of,
    read_sources_of,
    source_id_of,
    write_sources_of,
)
from pool.errors import InvalidInput
from pool.models import TaskSampleRecord
from pool.replica import replica_handler
from pool.selectors.tasks import (
    SORTS,
    task_render,
    task_stats_render,
    tasks_filtered,
    tasks_listed,
    tasks_page,
)
from pool.services.task_catalog import TaskIn, tasks_register, tasks_sample

from .. import serializers as s
from .common import _methods_scope


# --- tasks and the task sampler -------------------------------------------------------------------
class TaskListCreateApi(KnownQueryParams, APIView):
    """``GET``: tasks with their statistics (filters of pool.selectors.tasks.TaskFilter, ``sort``
    one of its SORTS, ``-`` for descending, keyset ``cursor``). ``POST``: register tasks in
    bulk, idempotent by uid (same content: unchanged; other content: updated)."""

    def get_permissions(self):
        return _methods_scope(self.request)

    @extend_schema(
        request=s.TaskRegisterSerializer,
        responses={
            200: OpenApiResponse(description="created, updated, unchanged counts and per-task status")
        },
        summary="Register tasks in bulk (idempotent by uid)",
    )
    def post(self, request):
        ser = s.TaskRegisterSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        items = [
            TaskIn(
                uid=t["uid"],
                set_name=t["set"],
                prompt=t["prompt"],
                ground_truth=t["ground_truth"],
                metadata=t["metadata"],
                field_prefix=f"tasks[{i}].",
            )
            for i, t in enumerate(ser.validated_data["tasks"])
        ]
        result = tasks_register(
            tasks=items, source_id=source_id_of(request), sources=write_sources_of(request)
        )
        status_of = result.status_of()
        return Response(
            {
                "created": len(result.created),
                "updated": len(result.updated),
                "unchanged": len(result.unchanged),
                "tasks": [{"uid": t.uid, "status": status_of[t.uid]} for t in items],
            },
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("set", str),
            OpenApiParameter("uid", str),
            *(
                OpenApiParameter(n, float)
                for n in ("pass_rate_min", "pass_rate_max", "recent_pass_rate_min", "recent_pass_rate_max")
            ),
            OpenApiParameter("seen_min", int),
            OpenApiParameter("seen_max", int),
            OpenApiParameter(
                "informative",
                bool,
                description="tasks with (true) or without (false) a group whose rewards differ "
                "(stats.informative_groups); the pass-rate bucket is ``bucket``",
            ),
            OpenApiParameter("bucket", str, enum=["unseen", "solved", "hopeless", "informative"]),
            OpenApiParameter(
                "sort",
                str,
                enum=[*SORTS, *(f"-{name}" for name in SORTS)],
                description="uid, pass_rate, recent_pass_rate, score, seen, last_policy_version, created; '-' descending",
            ),
            OpenApiParameter("cursor", str),
            OpenApiParameter("page_size", int),
        ],
        responses=OpenApiResponse(description="{next, results: [task with stats]}"),
        summary="List tasks",
    )
    @replica_handler
    def get(self, request):
        params = request.query_params
        filters = {k: v for k, v in params.items() if k not in ("sort", "cursor", "page_size", "format")}
        qs = tasks_filtered(tasks_listed(read_sources_of(request)), filters, field="query")
        size = decimal(params.get("page_size", "100"))
        if size is None or not 1 <= size <= 1000:
            raise InvalidInput("page_size must be an integer from 1 to 1000", field="page_size")
        rows, cursor = tasks_page(
            qs, sort=params.get("sort", "created"), cursor=params.get("cursor"), size=size
        )
        nxt = None
        if cursor:
            query = params.copy()
            query["cursor"] = cursor
            nxt = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"next": nxt, "previous": None, "results": [task_render(t) for t in rows]})


class TaskSamplerApi(APIView):
    """A read of the tasks (what to roll out next) that records its answer: any key that may
    read tasks may ask (agents, rollout drivers with ingest keys, trainers with consume keys,
    readers); the answer covers only the tasks the caller may read."""

    permission_classes = [ReadScope]

    @extend_schema(
        request=s.TaskSamplerSerializer,
        responses={
            200: OpenApiResponse(
                description="{tasks: [{uid, prompt, ground_truth, metadata, reason, stats}], record}"
            )
        },
        summary="The tasks to roll out next (recorded)",
    )
    def post(self, request):
        ser = s.TaskSamplerSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        v = ser.validated_data
        result = tasks_sample(
            n=v["n"],
            strategy=v["strategy"],
            tasks=v["tasks"],
            seed=v["seed"],
            options={k: v.get(k) for k in ("explore_below", "explore_fraction", "temperature", "target")},
            api_key_id=key_id_of(request),
            source_id=source_id_of(request),
            read_sources=read_sources_of(request),
        )
        return Response(
            {
                "tasks": [
                    {
                        "uid": p.task.uid,
                        "set": p.task.set_name,
                        "prompt": p.task.prompt,
                        "ground_truth": p.task.ground_truth,
                        "metadata": p.task.metadata,
                        "reason": p.reason,
                        "stats": task_stats_render(p.task),
                    }
                    for p in result.picks
                ],
                "record": result.record.id,
                "seed": result.record.params["seed"],
            }
        )


class TaskSampleRecordApi(KnownQueryParams, generics.GenericAPIView):
    """The sampler's answers, oldest first (keyset pages): a restricted reader sees its sources' only."""

    permission_classes = [ReadScope]

    def get_queryset(self):
        qs = TaskSampleRecord.objects.all()
        sources = read_sources_of(self.request)
        if sources is not None:
            qs = qs.filter(source_id__in=sorted(sources))
        return qs

    @extend_schema(
        parameters=[OpenApiParameter("cursor", str), OpenApiParameter("page_size", int)],
        responses=OpenApiResponse(description="cursor pages of records"),
        summary="Sampler records",
    )
    @replica_handler
    def get(self, request):
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(
            [
                {
                    "id": r.id,
                    "strategy": r.strategy,
                    "params": r.params,
                    "tasks": [
                        {"uid": u, "reason": why} for u, why in zip(r.task_uids, r.reasons, strict=False)
                    ],
                    "api_key": r.api_key_id,
                    "source": r.source_id,
                    "created_at": r.created_at,
                }
                for r in page
            ]
        )
