"""REST API v1 of curation: datasets (versioned specs and their preview) and operator
labels. Views are adapters: parse, call one service or selector, render."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.response import Response
from rest_framework.views import APIView

from claw_kit.web.files import file_download
from claw_kit.web.query import KnownQueryParams
from pool.access.auth import (
    ConsumeScope,
    ReadScope,
    ScopePermission,
    key_id_of,
    principal_has_scope,
    served_sources_of,
    source_id_of,
    user_id_of,
)
from pool.errors import Conflict, Gone, InvalidInput, NotFound
from pool.models import Scope
from pool.replica import replica_handler, replica_reads
from pool.selectors.steps import step_ids_by_uid
from pool.selectors.trajectories import trajectory_ids_by_uid

from . import serializers as cs
from .models import Dataset, Lease, Snapshot
from .selectors.consumption import (
    consumer_of,
    consumer_owners,
    consumer_status,
    lease_body,
    snapshot_get,
    source_id_named,
)
from .selectors.specs import dataset_get, dataset_preview, datasets_list
from .services import consume, snapshots
from .services.counts import dataset_version_preview
from .services.datasets import dataset_create, dataset_update
from .services.labels import label_parse, steps_label, trajectories_label
from .specs import DatasetIn, PreviewIn, given, spec_parse, struct_parse


class CurateScope(ScopePermission):
    """Curation writes: admin keys, and signed-in operators (staff sessions)."""

    scopes = (Scope.ADMIN,)


def _actor(request) -> str:
    user = request.user
    if user_id_of(request) is not None:
        return user.get_username()
    return str(user) if key_id_of(request) is not None else ""


def _consumer_actor(request) -> consume.Actor:
    """Consumers and leases are their source's: a key acts on its source's (404 for
    others'); admin keys and operators on all."""
    return consume.Actor(
        source_id=source_id_of(request), admin=principal_has_scope(request.user, Scope.ADMIN)
    )


def _owner(request) -> int | None:
    """The source whose consumers and leases this request may read; None: all (admins)."""
    actor = _consumer_actor(request)
    return None if actor.admin else actor.source_id


def _dataset_edit(raw: Any) -> dict[str, Any]:
    """A PUT or PATCH body: a DatasetIn without its name (the path names the dataset)."""
    data = given(struct_parse(raw, DatasetIn))
    if "name" in data:
        raise InvalidInput("unknown field 'name': the path names the dataset", field="name")
    return data


def _spec_of(data: dict[str, Any]) -> dict[str, Any]:
    return {k: data[k] for k in ("filters", "grouping", "serving") if data.get(k) is not None}


def dataset_render(ds: Dataset, *, versions: bool = False) -> dict[str, Any]:
    current = ds.current
    out: dict[str, Any] = {
        "name": ds.name,
        "description": ds.description,
        "version": current.version if current else None,
        "filters": current.spec["filters"] if current else None,
        "grouping": current.spec["grouping"] if current else None,
        "serving": current.spec.get("serving") if current else None,
        "created_at": ds.created_at,
        "updated_at": ds.updated_at,
    }
    if versions:
        out["versions"] = [
            {"version": v.version, "spec": v.spec, "created_by": v.created_by, "created_at": v.created_at}
            for v in ds.versions.order_by("version")
        ]
    return out


def _dataset(request, name: str) -> Dataset:
    """The dataset ``name`` if the request may see it (curation/selectors/specs.py), else the
    404 of an unknown name."""
    ds = dataset_get(name, sources=served_sources_of(request))
    if ds is None:
        raise NotFound(f"dataset {name!r} does not exist", field="name")
    return ds


class DatasetListCreateApi(KnownQueryParams, APIView):
    def get_permissions(self):
        return [CurateScope()] if self.request.method == "POST" else [ReadScope()]

    @extend_schema(
        summary="Datasets and their current version",
        responses=cs.DatasetSerializer(many=True),
        operation_id="datasets_list",
    )
    @replica_handler
    def get(self, request):
        datasets = datasets_list(limit=1000, sources=served_sources_of(request))
        return Response([dataset_render(d) for d in datasets])

    @extend_schema(
        summary='Create a dataset: {"name", "description", "filters": {...}, "grouping": {...}}',
        request=cs.DatasetWriteSerializer,
        responses={201: cs.DatasetSerializer},
    )
    def post(self, request):
        data = given(struct_parse(request.data, DatasetIn))
        ds = dataset_create(
            name=data.get("name"),  # type: ignore[arg-type]
            spec=_spec_of(data),
            description=data.get("description") or "",
            actor=_actor(request),
        )
        return Response(dataset_render(ds, versions=True), status=status.HTTP_201_CREATED)


class DatasetDetailApi(KnownQueryParams, APIView):
    def get_permissions(self):
        return [CurateScope()] if self.request.method in ("PUT", "PATCH") else [ReadScope()]

    @extend_schema(summary="A dataset with every version", responses=cs.DatasetSerializer)
    def get(self, request, name: str):
        return Response(dataset_render(_dataset(request, name), versions=True))

    @extend_schema(
        summary="Edit a dataset: a changed spec adds a version (older ones stay as they were)",
        request=cs.DatasetSpecSerializer,
        responses=cs.DatasetSerializer,
    )
    def patch(self, request, name: str):
        data = _dataset_edit(request.data)
        spec = None
        if "filters" in data or "grouping" in data or "serving" in data:
            current = _dataset(request, name).current
            base = current.spec if current else {}
            # PATCH: a part not given keeps the current version's (the serving rules too: a
            # filter edit used to reset a trainer's stale_after and capacity).
            spec = {
                part: data[part] if part in data else base.get(part)
                for part in ("filters", "grouping", "serving")
                if part in data or base.get(part) is not None
            }
        ds = dataset_update(name=name, spec=spec, description=data.get("description"), actor=_actor(request))
        return Response(dataset_render(ds, versions=True))

    @extend_schema(
        summary="Replace a dataset's spec (a new version when it changes)",
        request=cs.DatasetSpecSerializer,
        responses=cs.DatasetSerializer,
    )
    def put(self, request, name: str):
        data = _dataset_edit(request.data)
        ds = dataset_update(
            name=name, spec=_spec_of(data), description=data.get("description"), actor=_actor(request)
        )
        return Response(dataset_render(ds, versions=True))


class DatasetPreviewApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="What a saved dataset admits now: counts and token statistics", responses=cs.PreviewSerializer
    )
    def get(self, request, name: str):
        ds = _dataset(request, name)
        if ds.current is None:
            raise NotFound(f"dataset {name!r} does not exist", field="name")
        with replica_reads():  # the dataset itself was read from the primary: it may be new
            preview = dataset_version_preview(ds.current, served_sources_of(request))
        return Response({"dataset": ds.name, "version": ds.current.version, **preview})


class SpecPreviewApi(APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary='Preview an unsaved spec: {"filters": {...}, "grouping": {...}}',
        request=cs.DatasetSpecSerializer,
        responses=cs.PreviewSerializer,
    )
    def post(self, request):
        data = given(struct_parse(request.data, PreviewIn))
        with replica_reads():  # a read-only POST: the spec travels in the body
            return Response(
                dataset_preview(
                    spec_parse(_spec_of(data)), served_sources_of(request), estimate=not data.get("exact")
                )
            )


class LabelApi(APIView):
    permission_classes = [CurateScope]

    @extend_schema(
        summary="Operator labels: {step_uids | trajectory_uids, label, tags_add, tags_remove, note}",
        request=cs.LabelSerializer,  # derived from LabelIn
        responses=inline_serializer("LabelResult", {"changed": serializers.IntegerField()}),
    )
    def post(self, request):
        change_in = label_parse(request.data)
        key = "step_uids" if change_in.step_uids is not None else "trajectory_uids"
        uids: list[str] = getattr(change_in, key)
        found = (step_ids_by_uid if key == "step_uids" else trajectory_ids_by_uid)(uids)
        missing = [u for u in uids if u not in found]
        if missing:
            raise NotFound(
                f"{'step' if key == 'step_uids' else 'trajectory'} {missing[0]!r} does not exist",
                field=f"{key}[{uids.index(missing[0])}]",
            )
        change = dict(
            actor=_actor(request),
            user_id=user_id_of(request),
            label=change_in.label,
            tags_add=change_in.tags_add,
            tags_remove=change_in.tags_remove,
            note=change_in.note,
        )
        if key == "step_uids":
            changed = steps_label(step_ids=found.values(), **change)
        else:
            changed = trajectories_label(trajectory_ids=found.values(), **change)
        return Response({"changed": changed})


# --- consumption ------------------------------------------------------------------------------
# Long-poll re-check period: a pull is one indexed query when nothing is ready.
WAIT_POLL_SECONDS = 0.25
EMPTY_PULL = b'{"lease_id":null,"manifest":null,"batch":null}'


class PullApi(APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="Lease the next batch of a dataset to this consumer (exactly once per consumer)",
        request=cs.PullSerializer,
        responses=cs.PullResultSerializer,
    )
    def post(self, request, name: str):
        pull = consume.pull_parse(request.data)
        actor = _consumer_actor(request)
        deadline = time.monotonic() + pull.wait
        while True:
            lease = consume.consumer_pull(consumer=name, pull=pull, actor=actor)
            if lease is not None:
                return HttpResponse(bytes(lease.body), content_type="application/json")
            if time.monotonic() >= deadline:
                return HttpResponse(EMPTY_PULL, content_type="application/json")
            time.sleep(min(WAIT_POLL_SECONDS, max(0.0, deadline - time.monotonic())))


class LeaseAckApi(APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="The batch was consumed: its units are done for this consumer",
        request=None,
        responses=cs.LeaseSerializer,
    )
    def post(self, request, lease_id):
        return Response(lease_render(consume.lease_ack(lease_id=lease_id, actor=_consumer_actor(request))))


class LeaseNackApi(APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="Give the batch back: its units are deliverable again",
        request=None,
        responses=cs.LeaseSerializer,
    )
    def post(self, request, lease_id):
        return Response(lease_render(consume.lease_nack(lease_id=lease_id, actor=_consumer_actor(request))))


class LeaseReleaseApi(APIView):
    permission_classes = [CurateScope]

    @extend_schema(
        summary="An admin releases any consumer's lease (as its nack: the units are deliverable "
        "again); audited",
        request=None,
        responses=cs.LeaseSerializer,
    )
    def post(self, request, lease_id):
        return Response(lease_render(consume.lease_release(lease_id=lease_id, actor=_actor(request))))


class LeaseBatchApi(KnownQueryParams, APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="Replay: the batch exactly as first served, byte for byte (after ack too)",
        description="Within the replay window (CLAW_RETENTION_REPLAY_DAYS from the pull). Past it, "
        "a lease that is no longer open keeps its manifest and drops its batch, and this answers "
        "410 naming the lease; a lease of a consumer with a training run keeps its batch.",
        responses=cs.PullResultSerializer,
    )
    def get(self, request, lease_id):
        found = lease_body(lease_id, owner=_owner(request))
        if found is None:
            raise NotFound(f"lease {lease_id} does not exist", field="lease")
        body, dropped_at = found
        if dropped_at is not None:
            raise Gone(
                f"lease {lease_id}'s batch was dropped at {dropped_at.isoformat()}, past its replay "
                f"window of {settings.CLAW_RETENTION_REPLAY_DAYS:g} days (CLAW_RETENTION_REPLAY_DAYS); "
                "its manifest is kept (the lease's page in the dashboard shows it)",
                field="lease",
            )
        return HttpResponse(body, content_type="application/json")


class ConsumerDetailApi(KnownQueryParams, APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary="A consumer's progress per dataset: leases, delivered and pending units, and "
        "the units dropped for it, by reason (filtered, stale, capacity)",
        description="Consumer names are per source: ``name`` is the caller's source's consumer. "
        "An admin key or operator may name another source's with ``source`` (its name); "
        "without it, its own, else the only consumer of that name (400 when several).",
        parameters=[
            OpenApiParameter(
                "source", str, description="admins only: the source whose consumer to read (its name)"
            )
        ],
        responses=OpenApiTypes.OBJECT,
    )
    def get(self, request, name: str):
        found = consumer_status(name, source_id=_consumer_source(request, name))
        if found is None:
            raise NotFound(f"consumer {name!r} has never pulled", field="name")
        return Response(found)


def _consumer_source(request, name: str) -> int | None:
    """Whose consumer ``name`` means (names are per source): the key's source. An admin key
    or operator names one with the ``source`` query parameter (a source name); without it,
    its own source's (an operator session's: the unowned one) when that exists, else the
    only consumer of that name, and when several sources have one, a 400 naming ``source``.
    A non-admin naming a source is a 400 naming ``source``; an unknown source a 404."""
    actor = _consumer_actor(request)
    named = request.query_params.get("source")
    if named is None:
        if not actor.admin or consumer_of(name, source_id=actor.source_id) is not None:
            return actor.source_id
        owners = consumer_owners(name)
        if len(owners) > 1:
            raise InvalidInput(
                f"{len(owners)} sources have a consumer named {name!r}: name one with ?source=",
                field="source",
            )
        return owners[0] if owners else actor.source_id
    if not actor.admin:
        raise InvalidInput("only an admin key or operator may name another source", field="source")
    source_id = source_id_named(named)
    if source_id is None:
        raise NotFound(f"source {named!r} does not exist", field="source")
    return source_id


def lease_render(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": str(lease.id),
        "status": lease.status,
        "units": lease.n_units,
        "steps": lease.n_steps,
        "content_hash": lease.content_hash,
        "created_at": lease.created_at,
        "expires_at": lease.expires_at,
        "acked_at": lease.acked_at,
    }


# --- snapshots --------------------------------------------------------------------------------
# Creating a snapshot starts a build (work and storage): trainers (consume keys), admin keys
# and operators. Its status and files are reads: consume keys (a snapshot is what their pulls
# would serve, every source's), read and admin keys and operators read every snapshot; an
# ingest key only a done one holding its sources' rows alone, else the 404 of an unknown id.


class SnapshotCreateApi(APIView):
    permission_classes = [ConsumeScope]

    @extend_schema(
        summary=(
            'Freeze what a dataset admits now into files: {"dataset": name}, optionally with a TRL export '
            '("format": "sft" with "min_reward", or "dpo" with "margin"); built in the background'
        ),
        request=cs.SnapshotCreateSerializer,
        responses={202: cs.SnapshotSerializer},
    )
    def post(self, request):
        asked = snapshots.snapshot_parse(request.data)
        snap = snapshots.snapshot_create(
            dataset=asked.dataset,
            actor=_actor(request),
            format=asked.format,
            min_reward=asked.min_reward,
            margin=asked.margin,
        )
        snap = _snapshot(request, snap.id)
        return Response(snapshot_render(snap), status=status.HTTP_202_ACCEPTED)


class SnapshotDetailApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]

    @extend_schema(
        summary="A snapshot: status, progress and (once done) its manifest", responses=cs.SnapshotSerializer
    )
    def get(self, request, snapshot_id):
        return Response(snapshot_render(_snapshot(request, snapshot_id)))


class _FileNegotiation(BaseContentNegotiation):
    """``?format=`` names the file format here, not DRF's renderer override (which would
    404 on "jsonl"): errors render with the default (JSON) renderer."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class SnapshotDownloadApi(KnownQueryParams, APIView):
    permission_classes = [ReadScope]
    content_negotiation_class = _FileNegotiation

    @extend_schema(
        summary="Download a done snapshot's file (streamed); 409 while it is not done",
        parameters=[
            OpenApiParameter(
                "format",
                str,
                enum=list(snapshots.CONTENT_TYPES),
                description=(
                    "jsonl (default) or parquet; sft or dpo for a snapshot built with that TRL export;"
                    " tar (snapshot.jsonl plus media/<sha256>.<ext>) for a snapshot with images"
                ),
            )
        ],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY},
    )
    def get(self, request, snapshot_id):
        fmt = request.query_params.get("format", "jsonl")
        known = list(snapshots.CONTENT_TYPES)
        if fmt not in known:
            raise InvalidInput(f"format must be one of {known}", field="format")
        snap = _snapshot(request, snapshot_id)
        if snap.status != Snapshot.Status.DONE:
            raise Conflict(f"snapshot {snap.id} is {snap.status}: download it once done", field="snapshot")
        if fmt not in snap.files:
            raise InvalidInput(
                f"snapshot {snap.id} was built without the {fmt} export (formats: {sorted(snap.files)})",
                field="format",
            )
        version = snap.dataset_version
        suffix = f"{fmt}.jsonl" if fmt in snapshots.EXPORTS else fmt
        return file_download(
            request,
            default_storage.open(snap.files[fmt], "rb"),
            as_attachment=True,
            filename=f"{version.dataset.name}-v{version.version}-{snap.id}.{suffix}",
            content_type=snapshots.CONTENT_TYPES[fmt],
        )


def _snapshot(request, snapshot_id) -> Snapshot:
    """The snapshot if the request may read it (selectors.consumption.snapshot_get), else
    the 404 of an unknown id."""
    snap = snapshot_get(snapshot_id, sources=served_sources_of(request))
    if snap is None:
        raise NotFound(f"snapshot {snapshot_id} does not exist", field="snapshot")
    return snap


def snapshot_render(snap: Snapshot) -> dict[str, Any]:
    version = snap.dataset_version
    return {
        "id": str(snap.id),
        "dataset": version.dataset.name,
        "dataset_version": version.version,
        "status": snap.status,
        "progress": {"steps_done": snap.steps_done, "steps_total": snap.steps_total},
        "content_hash": snap.content_hash,
        "manifest": snap.manifest,
        "formats": sorted(snap.files),
        "error": snap.error,
        "created_by": snap.created_by,
        "created_at": snap.created_at,
        "updated_at": snap.updated_at,
    }
