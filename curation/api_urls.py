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
]
