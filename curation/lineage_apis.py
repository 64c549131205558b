"""REST API v1 of lineage: training runs and their checkpoints, the data behind each, the
checkpoints a step, a trajectory or a source trained, two checkpoints' difference, a run
replayed (curation/services/lineage.py, curation/selectors/lineage.py), trainers' verdicts
(curation/services/verdicts.py), and what changed between two dataset versions or two
snapshots (curation/selectors/diffs.py). Views are adapters.

Lists are keyset-paged: ``{"results": [...], "next": <url or null>}``, ``page_size`` up to
MAX_PAGE, ``cursor`` opaque (the ``next`` link carries it).

Who sees what (pool/tenancy.py): runs are their consumer's source's; a key reads its read
sources' runs (read and admin keys every run; another source's run answers like an unknown
uid). The steps behind a checkpoint are the reader's served sources' (a trainer's key: every
source's, as its pulls served them; another key: its own sources'). Opening a run and
replaying one (whole batches, every source's tokens) are a trainer's: consume keys, for
their own source's runs, and admins.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import orjson
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from claw_kit.web.files import stream_download
from claw_kit.web.query import KnownQueryParams, decimal
from claw_kit.web.serializers import struct_serializer
from pool.access.auth import ConsumeScope, ReadScope, read_sources_of, served_sources_of
from pool.errors import Conflict, InvalidInput, NotFound

from .apis import _consumer_actor, _dataset, _owner, _snapshot
from .models import Checkpoint, Run, Snapshot
from .selectors import diffs
from .selectors import lineage as sel
from .services import lineage, verdicts

DEFAULT_PAGE, MAX_PAGE = 100, 1000
RUN_SERIALIZER = struct_serializer(lineage.RunIn, "RunIn")
VERDICTS_SERIALIZER = struct_serializer(verdicts.VerdictsIn, "VerdictsIn")
PAGED = [
    OpenApiParameter("cursor", str, description="the ``next`` link's cursor"),
    OpenApiParameter(
        "page_size", int, description=f"results per page (1-{MAX_PAGE}, default {DEFAULT_PAGE})"
    ),
]


# --- paging ----------------------------------------------------------------------------------------
def _page_args(request) -> tuple[Any, int]:
    """(the cursor's key or None, the page size), or InvalidInput naming the parameter."""
    raw = request.query_params.get("page_size")
    size = DEFAULT_PAGE
    if raw is not None:
        n = decimal(raw)
        if n is None or not 1 <= n <= MAX_PAGE:
            raise InvalidInput(f"page_size must be an integer in [1, {MAX_PAGE}]", field="page_size")
        size = n
    cursor = request.query_params.get("cursor")
    if cursor is None:
        return None, size
    try:
        key = orjson.loads(base64.urlsafe_b64decode(cursor.encode() + b"=" * (-len(cursor) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        key = None
    if not isinstance(key, int | str) or isinstance(key, bool):
        raise _bad_cursor()
    return key, size


def _bad_cursor() -> NotFound:
    """A cursor this endpoint did not give: a 404, as the API's other lists answer one."""
    return NotFound("invalid cursor: not one this endpoint gave", field="cursor")


def _int_key(key: Any) -> int | None:
    if key is not None and not isinstance(key, int):
        raise _bad_cursor()
    return key


def _paged(request, results: list[Any], size: int, last_key: Any) -> Response:
    """The page, with a ``next`` link when it is full (the next page may be empty)."""
    nxt = None
    if len(results) == size:
        token = base64.urlsafe_b64encode(orjson.dumps(last_key)).rstrip(b"=").decode()
        nxt = replace_query_param(request.build_absolute_uri(), "cursor", token)
    return Response({"results": results, "next": nxt})


# --- renders ---------------------------------------------------------------------------------------
def run_render(run: Run) -> dict[str, Any]:
    return {
        "uid": run.uid,
        "name": run.name,
        "consumer": run.consumer.name,
        "dataset": run.dataset.name,
        "source": run.source.name if run.source_id is not None else None,
        "policy": run.policy,
        "config": run.config,
        "code_version": run.code_version,
        "created_at": run.created_at,
    }


def checkpoint_render(cp: Checkpoint) -> dict[str, Any]:
    return {
        "version": cp.version,
        "created_at": cp.created_at,
        "metadata": cp.metadata,
        "leases": cp.n_leases,
        "steps": cp.n_steps,
        "reward_mean": cp.reward_mean,
    }


def _run(request, uid: str) -> Run:
    run = sel.run_get(uid, sources=read_sources_of(request))
    if run is None:
        raise NotFound(f"run {uid!r} does not exist", field="run")
    return run


def _checkpoint(run: Run, version: int, *, field: str = "version") -> Checkpoint:
    cp = sel.checkpoint_get(run, version)
    if cp is None:
        raise NotFound(f"run {run.uid!r} has no checkpoint {version}", field=field)
    return cp


# --- runs ------------------------------------------------------------------------------------------
class RunListCreateApi(KnownQueryParams, APIView):
    def get_permissions(self):
        return [ConsumeScope()] if self.request.method == "POST" else [ReadScope()]

    @extend_schema(
        summary='Open a training run: {"consumer", "dataset", "name", "config", "code_version"}; '
        'its uid is what "run" names when publishing a policy version as a checkpoint',
        request=RUN_SERIALIZER,
        responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT},
    )
    def post(self, request):
        run, created = lineage.run_open(run=lineage.run_parse(request.data), actor=_consumer_actor(request))
        run = sel.run_get(run.uid, sources=None)
        assert run is not None
        return Response(run_render(run), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(
        operation_id="runs_list",
        summary="Training runs, newest first",
        parameters=PAGED,
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request):
        key, size = _page_args(request)
        runs = sel.runs_page(sources=read_sources_of(request), after=_int_key(key), limit=size)
        return _paged(request, [run_render(r) for r in runs], size, runs[-1].id if runs else None)


class RunDetailApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="A training run, its checkpoint count, its last checkpoint and the acks its next "
        "checkpoint will take so far",
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str):
        run = _run(request, uid)
        last = sel.run_checkpoints_last(run)
        return Response(
            {
                **run_render(run),
                "checkpoints": sel.run_checkpoint_count(run),
                "last_checkpoint": checkpoint_render(last) if last is not None else None,
                "unclaimed_leases": sel.unclaimed_acks(run),
            }
        )


class RunCheckpointsApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        operation_id="runs_checkpoints_list",
        summary="A run's checkpoints in version order, each with its leases, steps and mean reward",
        parameters=PAGED,
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str):
        run = _run(request, uid)
        key, size = _page_args(request)
        cps = sel.run_checkpoints(run, after=_int_key(key), limit=size)
        return _paged(request, [checkpoint_render(c) for c in cps], size, cps[-1].version if cps else None)


class CheckpointDetailApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="What is behind a checkpoint: its leases in ack order, the counts of its steps, "
        "trajectories, sources, tasks and dataset versions",
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str, version: int):
        run = _run(request, uid)
        cp = _checkpoint(run, version)
        return Response(
            {
                "run": run.uid,
                **checkpoint_render(cp),
                **sel.checkpoint_summary(cp, sources=served_sources_of(request)),
            }
        )


class CheckpointStepsApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="The steps behind a checkpoint, in the order they were served",
        parameters=PAGED,
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str, version: int):
        cp = _checkpoint(_run(request, uid), version)
        key, size = _page_args(request)
        rows = sel.checkpoint_steps(cp, sources=served_sources_of(request), after=_int_key(key), limit=size)
        results = [{k: v for k, v in r.items() if k != "step_id"} for r in rows]
        return _paged(request, results, size, rows[-1]["position"] if rows else None)


class CheckpointStepsDownloadApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="Every step uid behind a checkpoint, one per line (text/plain), in order",
        responses={(200, "text/plain"): OpenApiTypes.STR},
    )
    def get(self, request, uid: str, version: int):
        run = _run(request, uid)
        cp = _checkpoint(run, version)
        uids = sel.checkpoint_step_uids(cp, sources=served_sources_of(request))
        return stream_download(
            request,
            (u.encode() + b"\n" for u in uids),
            content_type="text/plain; charset=utf-8",
            filename=f"{run.uid}-{cp.version}-steps.txt",
        )


class CheckpointTrajectoriesApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="The trajectories behind a checkpoint, each with its steps there",
        parameters=PAGED,
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str, version: int):
        cp = _checkpoint(_run(request, uid), version)
        key, size = _page_args(request)
        rows = sel.checkpoint_trajectories(
            cp, sources=served_sources_of(request), after=_int_key(key), limit=size
        )
        last = rows[-1]["id"] if rows else None
        return _paged(request, [{k: v for k, v in r.items() if k != "id"} for r in rows], size, last)


class CheckpointDiffApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="How two checkpoints' data differ: steps added (behind ``to``, not this one), "
        "removed, common, counted, and one side listed",
        parameters=[
            OpenApiParameter("to", int, required=True, description="the other checkpoint's version"),
            OpenApiParameter("to_run", str, description="its run (default: this run)"),
            OpenApiParameter("side", str, enum=list(sel.DIFF_SIDES), description="the side listed (added)"),
            *PAGED,
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str, version: int):
        run = _run(request, uid)
        a = _checkpoint(run, version)
        to = decimal(request.query_params.get("to"))
        if to is None:
            raise InvalidInput("to must be a checkpoint's version", field="to")
        other = _run(request, request.query_params["to_run"]) if "to_run" in request.query_params else run
        b = _checkpoint(other, to, field="to")
        side = request.query_params.get("side", "added")
        if side not in sel.DIFF_SIDES:
            raise InvalidInput(f"side must be one of {list(sel.DIFF_SIDES)}", field="side")
        key, size = _page_args(request)
        if key is not None and not isinstance(key, str):
            raise _bad_cursor()
        sources = served_sources_of(request)
        uids = sel.checkpoints_diff_page(a, b, side=side, sources=sources, after=key, limit=size)
        page = _paged(request, uids, size, uids[-1] if uids else None)
        page.data = {
            "from": {"run": run.uid, "version": a.version},
            "to": {"run": other.uid, "version": b.version},
            "counts": sel.checkpoints_diff_counts(a, b, sources=sources),
            "side": side,
            **page.data,
        }
        return page


class RunReplayApi(KnownQueryParams, APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="Replay a run: every batch of its checkpoints in order, byte for byte as served, "
        "as JSON lines, each checkpoint's line naming the steps removed from the pool since",
        responses={(200, "application/x-ndjson"): OpenApiTypes.BINARY},
    )
    def get(self, request, uid: str):
        owner = _owner(request)
        run = sel.run_get(uid, sources=None if owner is None else frozenset((owner,)))
        if run is None:
            raise NotFound(f"run {uid!r} does not exist", field="run")
        return stream_download(
            request, sel.run_replay(run), content_type="application/x-ndjson", filename=f"{run.uid}.jsonl"
        )


class LeaseVerdictsApi(APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="A trainer's verdicts on a lease's steps: per step importance_ratio, logprob_kl, "
        "advantage, clipped_fraction, optionally per token; flags policy_mismatch over the "
        "dataset's serving.policy_mismatch_kl",
        request=VERDICTS_SERIALIZER,
        responses=inline_serializer(
            "VerdictsOut",
            {
                "stored": serializers.IntegerField(),
                "flagged": serializers.IntegerField(),
                "policy_mismatch_kl": serializers.FloatField(allow_null=True),
            },
        ),
    )
    def post(self, request, lease_id):
        asked = verdicts.verdicts_parse(request.data)
        return Response(
            verdicts.lease_verdicts_post(lease_id=lease_id, steps=asked.steps, actor=_consumer_actor(request))
        )


# --- the other way ---------------------------------------------------------------------------------
def _checkpoints_of_render(cps: list[Checkpoint]) -> list[dict[str, Any]]:
    return [
        {"run": c.run.uid, "version": c.version, "created_at": c.created_at, "uses": c.uses}  # type: ignore[attr-defined]
        for c in cps
    ]


class _CheckpointsOfApi(KnownQueryParams, APIView):
    """The checkpoints (of the runs the caller reads) whose data holds a step, a trajectory
    or a source's steps: oldest first, each with ``uses``, how many served steps those are."""

    permission_classes = [ReadScope]

    def answer(self, request, **of: int) -> Response:
        key, size = _page_args(request)
        cps = sel.checkpoints_of(**of, runs=read_sources_of(request), after=_int_key(key), limit=size)
        return _paged(request, _checkpoints_of_render(cps), size, cps[-1].id if cps else None)


class StepCheckpointsApi(_CheckpointsOfApi):
    @extend_schema(summary="The checkpoints a step trained", parameters=PAGED, responses=OpenApiTypes.OBJECT)
    def get(self, request, uid: str):
        step_id = sel.step_id_visible(uid, sources=served_sources_of(request))
        if step_id is None:
            raise NotFound(f"step {uid!r} does not exist", field="uid")
        return self.answer(request, step_id=step_id)


class TrajectoryCheckpointsApi(_CheckpointsOfApi):
    @extend_schema(
        summary="The checkpoints a trajectory's steps trained",
        parameters=PAGED,
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, uid: str):
        tid = sel.trajectory_id_visible(uid, sources=served_sources_of(request))
        if tid is None:
            raise NotFound(f"trajectory {uid!r} does not exist", field="uid")
        return self.answer(request, trajectory_id=tid)


class SourceCheckpointsApi(_CheckpointsOfApi):
    @extend_schema(
        summary="The checkpoints a source's data trained", parameters=PAGED, responses=OpenApiTypes.OBJECT
    )
    def get(self, request, name: str):
        source_id = sel.source_visible(name, sources=served_sources_of(request))
        if source_id is None:
            raise NotFound(f"source {name!r} does not exist", field="name")
        return self.answer(request, source_id=source_id)


# --- what changed: dataset versions and snapshots -----------------------------------------------
def _side(request, sides: tuple[str, ...]) -> str:
    side = request.query_params.get("side", sides[0])
    if side not in sides:
        raise InvalidInput(f"side must be one of {list(sides)}", field="side")
    return side


def _version_number(request, name: str) -> int:
    number = decimal(request.query_params.get(name))
    if number is None:
        raise InvalidInput(f"{name} must be a version number of the dataset", field=name)
    return number


class DatasetDiffApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="How two versions of a dataset differ in what they admit now: steps added, "
        "removed, kept and served masked by one only, counted, and one side listed",
        parameters=[
            OpenApiParameter("from", int, required=True, description="the older version"),
            OpenApiParameter("to", int, required=True, description="the newer version"),
            OpenApiParameter("side", str, enum=list(diffs.VERSION_SIDES), description="listed (added)"),
            *PAGED,
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, name: str):
        ds = _dataset(request, name)
        versions = {v.version: v for v in ds.versions.all()}
        picked = []
        for param in ("from", "to"):
            number = _version_number(request, param)
            if number not in versions:
                raise NotFound(f"dataset {name!r} has no version {number}", field=param)
            picked.append(versions[number])
        side = _side(request, diffs.VERSION_SIDES)
        key, size = _page_args(request)
        d = diffs.versions_diff(
            picked[0],
            picked[1],
            sources=served_sources_of(request),
            side=side,
            after=_int_key(key),
            limit=size,
        )
        page = _paged(request, d.results, size, d.last)
        page.data = {
            "dataset": ds.name,
            "from": picked[0].version,
            "to": picked[1].version,
            "counts": d.counts,
            "side": side,
            **page.data,
        }
        return page


class SnapshotDiffApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="How another snapshot's content differs from this one's: steps added, removed, "
        "kept, and kept ones whose reward, quality flags or review changed",
        parameters=[
            OpenApiParameter("to", str, required=True, description="the other snapshot's id"),
            OpenApiParameter("side", str, enum=list(diffs.SNAPSHOT_SIDES), description="listed (added)"),
            *PAGED,
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, snapshot_id):
        a = _snapshot(request, snapshot_id)
        raw = request.query_params.get("to", "")
        try:
            other = uuid.UUID(raw)
        except ValueError:
            raise InvalidInput("to must be a snapshot's id", field="to") from None
        b = _snapshot(request, other)
        for snap, field in ((a, "snapshot"), (b, "to")):
            if snap.status != Snapshot.Status.DONE:
                raise Conflict(f"snapshot {snap.id} is {snap.status}: compare it once done", field=field)
        side = _side(request, diffs.SNAPSHOT_SIDES)
        key, size = _page_args(request)
        if key is not None and not isinstance(key, str):
            raise _bad_cursor()
        d = diffs.snapshots_diff(a, b, side=side, after=key, limit=size)
        page = _paged(request, d.results, size, d.last)
        page.data = {
            "from": {
                "id": str(a.id),
                "dataset": a.dataset_version.dataset.name,
                "version": a.dataset_version.version,
            },
            "to": {
                "id": str(b.id),
                "dataset": b.dataset_version.dataset.name,
                "version": b.dataset_version.version,
            },
            "counts": d.counts,
            "side": side,
            **page.data,
        }
        return page
