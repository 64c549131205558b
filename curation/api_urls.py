"""Curation's part of /api/v1/ (mounted beside gateway/urls.py)."""

from django.urls import path, re_path

from . import apis, lineage_apis

app_name = "curation_api"

urlpatterns = [
    path("datasets", apis.DatasetListCreateApi.as_view(), name="datasets"),
    path("datasets/preview", apis.SpecPreviewApi.as_view(), name="spec-preview"),
    path("datasets/<str:name>", apis.DatasetDetailApi.as_view(), name="dataset-detail"),
    path("datasets/<str:name>/preview", apis.DatasetPreviewApi.as_view(), name="dataset-preview"),
    path("datasets/<str:name>/diff", lineage_apis.DatasetDiffApi.as_view(), name="dataset-diff"),
    path("labels", apis.LabelApi.as_view(), name="labels"),
    path("consumers/<str:name>", apis.ConsumerDetailApi.as_view(), name="consumer-detail"),
    path("consumers/<str:name>/pull", apis.PullApi.as_view(), name="consumer-pull"),
    path("leases/<uuid:lease_id>/ack", apis.LeaseAckApi.as_view(), name="lease-ack"),
    path("leases/<uuid:lease_id>/nack", apis.LeaseNackApi.as_view(), name="lease-nack"),
    path("leases/<uuid:lease_id>/release", apis.LeaseReleaseApi.as_view(), name="lease-release"),
    path("leases/<uuid:lease_id>/batch", apis.LeaseBatchApi.as_view(), name="lease-batch"),
    path("leases/<uuid:lease_id>/verdicts", lineage_apis.LeaseVerdictsApi.as_view(), name="lease-verdicts"),
    path("snapshots", apis.SnapshotCreateApi.as_view(), name="snapshots"),
    path("snapshots/<uuid:snapshot_id>", apis.SnapshotDetailApi.as_view(), name="snapshot-detail"),
    path(
        "snapshots/<uuid:snapshot_id>/download", apis.SnapshotDownloadApi.as_view(), name="snapshot-download"
    ),
    path("snapshots/<uuid:snapshot_id>/diff", lineage_apis.SnapshotDiffApi.as_view(), name="snapshot-diff"),
    # Lineage (curation/lineage_apis.py). Mounted before gateway/urls.py (claw_site/urls.py):
    # steps/<uid>/checkpoints and trajectories/<uid>/checkpoints are matched here first.
    path("runs", lineage_apis.RunListCreateApi.as_view(), name="runs"),
    path("runs/<str:uid>", lineage_apis.RunDetailApi.as_view(), name="run-detail"),
    path("runs/<str:uid>/replay", lineage_apis.RunReplayApi.as_view(), name="run-replay"),
    path("runs/<str:uid>/checkpoints", lineage_apis.RunCheckpointsApi.as_view(), name="run-checkpoints"),
    path(
        "runs/<str:uid>/checkpoints/<int:version>",
        lineage_apis.CheckpointDetailApi.as_view(),
        name="checkpoint-detail",
    ),
    path(
        "runs/<str:uid>/checkpoints/<int:version>/steps",
        lineage_apis.CheckpointStepsApi.as_view(),
        name="checkpoint-steps",
    ),
    path(
        "runs/<str:uid>/checkpoints/<int:version>/steps/download",
        lineage_apis.CheckpointStepsDownloadApi.as_view(),
        name="checkpoint-steps-download",
    ),
    path(
        "runs/<str:uid>/checkpoints/<int:version>/trajectories",
        lineage_apis.CheckpointTrajectoriesApi.as_view(),
        name="checkpoint-trajectories",
    ),
    path(
        "runs/<str:uid>/checkpoints/<int:version>/diff",
        lineage_apis.CheckpointDiffApi.as_view(),
        name="checkpoint-diff",
    ),
    re_path(
        r"^steps/(?P<uid>.+)/checkpoints$", lineage_apis.StepCheckpointsApi.as_view(), name="step-checkpoints"
    ),
    re_path(
        r"^trajectories/(?P<uid>.+)/checkpoints$",
        lineage_apis.TrajectoryCheckpointsApi.as_view(),
        name="trajectory-checkpoints",
    ),
    path(
        "sources/<str:name>/checkpoints",
        lineage_apis.SourceCheckpointsApi.as_view(),
        name="source-checkpoints",
    ),
]
