"""REST API v1 for white-box agents, services and readers.

Views are adapters: parse and validate input, call one pool service or selector, render.
"""

from __future__ import annotations

import uuid
from urllib.parse import quote

from django.db import connection
from django.http import Http404, HttpResponse, JsonResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, generics, serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.files import file_download
from claw_kit.web.parsers import LimitedBodyParser
from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    IngestScope,
    PolicyWriteScope,
    ReadScope,
    key_id_of,
    principal_has_scope,
    read_sources_of,
    source_id_of,
    user_id_of,
    write_sources_of,
)
from pool.errors import InvalidInput, NotFound
from pool.models import Scope, TaskSampleRecord
from pool.replica import replica_handler
from pool.selectors.events import (
    event_render,
    events_listed,
    feedback_listed,
    feedback_render,
    policy_version_render,
    policy_versions_list,
    policy_versions_listed,
)
from pool.selectors.media import media_get
from pool.selectors.stats import pool_stats
from pool.selectors.steps import step_get, steps_listed, steps_render
from pool.selectors.tasks import (
    SORTS,
    task_render,
    task_stats_render,
    tasks_filtered,
    tasks_listed,
    tasks_page,
)
from pool.selectors.trajectories import (
    group_get,
    group_render,
    groups_listed,
    trajectories_listed,
    trajectory_get,
    trajectory_render,
)
from pool.services import (
    CompletionIn,
    RewardIn,
    event_record,
    feedback_create,
    policy_version_set,
    rewards_apply,
    steps_ingest,
    trajectories_complete,
    trajectory_complete,
)
from pool.services.capabilities import trajectory_create_with_capability
from pool.services.events import EventIn
from pool.services.groups import group_upsert
from pool.services.media import MEDIA_TYPES, media_file, media_render, media_upload
from pool.services.merge import group_merge_ensure, merge_tree_render
from pool.services.task_catalog import TaskIn, tasks_register, tasks_sample

from . import serializers as s
from .filters import EventFilter, FeedbackFilter, GroupFilter, StepFilter, TrajectoryFilter
from .parsers import StepBatchMsgpackParser, StepBatchParser


def _methods_scope(request, write=IngestScope, read=ReadScope):
    return [write()] if request.method not in ("GET", "HEAD", "OPTIONS") else [read()]


def _found(row):
    """``row``, or the API's 404 when a selector found none."""
    if row is None:
        raise Http404
    return row


def _one_or_many(data, key: str):
    """Accept ``{key: [...]}`` or a single object; returns (items, field prefix format)."""
    if isinstance(data, dict) and key in data:
        return data, True
    return {key: [data]}, False


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


class PolicyVersionApi(KnownQueryParams, generics.GenericAPIView):
    pagination_class = None

    def get_queryset(self):
        return policy_versions_listed()

    def get_permissions(self):
        return _methods_scope(self.request, write=PolicyWriteScope)

    @extend_schema(
        request=s.PolicyVersionSerializer,
        responses=inline_serializer(
            "PolicyVersionOut",
            {
                "version": serializers.IntegerField(),
                "is_current": serializers.BooleanField(),
                "policy": serializers.CharField(),
                "checkpoint": serializers.DictField(
                    required=False,
                    help_text='with "run": the checkpoint recorded (run, version, leases taken)',
                ),
            },
        ),
    )
    def post(self, request):
        ser = s.PolicyVersionSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        d = ser.validated_data
        if d["force"] and not principal_has_scope(request.user, Scope.ADMIN):
            raise exceptions.PermissionDenied(
                {"force": "\"force\" is for admins: this API key lacks the 'admin' scope"}
            )
        if user_id_of(request) is not None:
            actor, details = f"user:{request.user.get_username()}", {}
        else:
            key = request.user.key
            actor, details = f"key:{key.source_name}", {"key_id": key.key_id, "source": key.source_name}
        pv = policy_version_set(
            version=d["version"],
            current=d["current"],
            metadata=d.get("metadata"),
            force=d["force"],
            actor=actor,
            details=details,
            policy=d["policy"],
            source_id=source_id_of(request),
            sources=write_sources_of(request),
            run=d.get("run"),
        )
        # is_current: whether it is now the named policy's current version; ``policy`` is
        # answered for a named one only (the default's answer is as it always was).
        named = {} if pv.policy == "default" else {"policy": pv.policy, "is_current": pv.policy_current}
        # With "run": the checkpoint it recorded (curation/services/lineage.py).
        checkpoint = {} if pv.checkpoint is None else {"checkpoint": pv.checkpoint}
        return Response({**policy_version_render(pv), **named, **checkpoint})

    @extend_schema(
        responses=s.PolicyVersionReadSerializer(many=True), summary="Policy versions, newest first"
    )
    def get(self, request):
        return Response([policy_version_render(p) for p in policy_versions_list()])


class StatsApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        responses=OpenApiResponse(
            description="Pool counts and token economics (a restricted key's: its sources' rows only)"
        )
    )
    @replica_handler
    def get(self, request):
        return Response(pool_stats(read_sources_of(request)))


def healthz(request):
    """Liveness + database reachability. Unauthenticated by design: it reveals nothing."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return JsonResponse({"status": "ok"})
    except Exception:  # noqa: BLE001 - any DB failure means unhealthy
        return JsonResponse({"status": "error", "db": "unreachable"}, status=503)


# --- media (issue 24): images stored once by content -------------------------------------------
class ImageBodyParser(LimitedBodyParser):
    """A raw image body (``Content-Type: image/png`` ...): its bytes, checked by the service."""

    media_type = "image/*"

    def decode(self, data: bytes):
        return data


class OctetStreamParser(ImageBodyParser):
    media_type = "application/octet-stream"  # the type is then read from the bytes


class MediaUploadApi(APIView):
    """POST /api/v1/media: store one image (PNG, JPEG, WebP or GIF), idempotent by content."""

    permission_classes = [IngestScope]
    parser_classes = [ImageBodyParser, OctetStreamParser, MultiPartParser]

    @extend_schema(
        request={"image/*": {"type": "string", "format": "binary"}, "multipart/form-data": None},
        responses={201: s.MediaSerializer},
        summary="Upload an image (raw body with its image/* type, or multipart field 'file')",
    )
    def post(self, request):
        data, declared, field = _upload_of(request)
        # 201 whether or not the bytes were stored already (by this source or another): the
        # answer must not tell what other sources hold (pool.services.media.media_upload).
        media = media_upload(data=data, declared_type=declared, source_id=source_id_of(request), field=field)
        return Response(media_render(media), status=status.HTTP_201_CREATED)


def _upload_of(request) -> tuple[bytes, str | None, str]:
    """(bytes, declared type, its field) of an upload: the raw body, or multipart's ``file`` part."""
    content_type = (request.content_type or "").split(";")[0].strip().lower()
    if content_type.startswith("multipart/"):
        upload = request.FILES.get("file")
        if upload is None:
            raise InvalidInput("multipart upload needs a 'file' part", field="file")
        declared = (upload.content_type or "").split(";")[0].strip() or None
        if declared == "application/octet-stream":
            declared = None
        return upload.read(), declared, "file"
    if not content_type:
        raise InvalidInput("send the image as the body with its Content-Type (image/png, ...)", field="body")
    data = request.data
    if not isinstance(data, bytes) or not data:
        raise InvalidInput("empty body; expected the image's bytes", field="body")
    return data, None if content_type == "application/octet-stream" else content_type, "body"


class MediaDetailApi(KnownQueryParams, APIView):
    """GET /api/v1/media/<sha256>: the image's bytes, as stored, with its checked type."""

    permission_classes = [ReadScope]

    def perform_content_negotiation(self, request, force=False):
        return super().perform_content_negotiation(request, force=True)  # bytes whatever Accept says

    @extend_schema(
        responses={(200, "image/*"): OpenApiResponse(description="the image's bytes")},
        summary="Download an image by its sha256 (immutable; ETag is the sha256)",
    )
    def get(self, request, sha256: str):
        sources = None if principal_has_scope(request.user, Scope.CONSUME) else read_sources_of(request)
        media = _found(media_get(sha256=sha256, sources=sources))
        etag = f'"{media.sha256}"'
        if etag in [t.strip() for t in request.META.get("HTTP_IF_NONE_MATCH", "").split(",")]:
            response = HttpResponse(status=304)
        else:
            response = file_download(request, media_file(media), content_type=media.media_type)
            response["Content-Length"] = str(media.byte_size)
        raster = media.media_type in MEDIA_TYPES.values()
        ext = media.media_type.split("/")[-1] if raster else "bin"
        disposition = "inline" if raster else "attachment"
        response["Content-Disposition"] = f'{disposition}; filename="{media.sha256}.{ext}"'
        response["X-Content-Type-Options"] = "nosniff"
        # Content-addressed, so never stale; private: it is served to authenticated callers only.
        response["Cache-Control"] = "private, max-age=31536000, immutable"
        response["ETag"] = etag
        return response


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
        size = params.get("page_size", "100")
        if not size.isdigit() or not 1 <= int(size) <= 1000:
            raise InvalidInput("page_size must be an integer from 1 to 1000", field="page_size")
        rows, cursor = tasks_page(
            qs, sort=params.get("sort", "created"), cursor=params.get("cursor"), size=int(size)
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
