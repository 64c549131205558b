"""Curation's part of /api/v1/ (mounted beside gateway/urls.py)."""

from django.urls import path

from . import apis

app_name = "curation_api"

urlpatterns = [
    path("datasets", apis.DatasetListCreateApi.as_view(), name="datasets"),
    path("datasets/preview", apis.SpecPreviewApi.as_view(), name="spec-preview"),
    path("datasets/<str:name>", apis.DatasetDetailApi.as_view(), name="dataset-detail"),
    path("datasets/<str:name>/preview", apis.DatasetPreviewApi.as_view(), name="dataset-preview"),
    path("labels", apis.LabelApi.as_view(), name="labels"),
    path("consumers/<str:name>", apis.ConsumerDetailApi.as_view(), name="consumer-detail"),
    path("consumers/<str:name>/pull", apis.PullApi.as_view(), name="consumer-pull"),
    path("leases/<uuid:lease_id>/ack", apis.LeaseAckApi.as_view(), name="lease-ack"),
    path("leases/<uuid:lease_id>/nack", apis.LeaseNackApi.as_view(), name="lease-nack"),
    path("leases/<uuid:lease_id>/release", apis.LeaseReleaseApi.as_view(), name="lease-release"),
    path("leases/<uuid:lease_id>/batch", apis.LeaseBatchApi.as_view(), name="lease-batch"),
    path("snapshots", apis.SnapshotCreateApi.as_view(), name="snapshots"),
    path("snapshots/<uuid:snapshot_id>", apis.SnapshotDetailApi.as_view(), name="snapshot-detail"),
    path(
        "snapshots/<uuid:snapshot_id>/download", apis.SnapshotDownloadApi.as_view(), name="snapshot-download"
    ),
]
