"""Curate: labels, the dataset builder with its live preview, and one dataset's page."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from pool.errors import Conflict, InvalidInput, PoolError
from pool.replica import replica_reads, replica_view

from ..forms import (
    DatasetForm,
)
from ..selectors.live import live_state
from ..selectors.specs import dataset_preview, dataset_versions, datasets_list
from ..services.counts import dataset_version_preview
from ..services.datasets import dataset_create, dataset_update
from ..specs import serving_summary, spec_parse
from .access import CURATE, allowed


# --- curation --------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
@allowed(CURATE)
@replica_view
def curation(request: HttpRequest) -> HttpResponse:
    """The filter builder; a POST saves its spec as a dataset (create, or a new version)."""
    if request.method == "POST":
        form = DatasetForm(request.POST)
        if form.is_valid():
            if not form.cleaned_data["name"]:
                form.add_error("name", "name the dataset to save it")
            else:
                try:
                    dataset = _dataset_save(request, form)
                except PoolError as exc:
                    form.add_error(_form_field(form, exc.field), f"{exc.field}: {exc.message}")
                else:
                    messages.success(request, f"Saved {dataset.name} v{dataset.current.version}.")
                    return redirect("curation:dataset", name=dataset.name)
        status, preview = 400, None
    else:
        initial = {}
        edit = dataset_versions(request.GET["dataset"]) if request.GET.get("dataset") else None
        if edit is not None:
            dataset = edit[0]
            initial = DatasetForm.initial_from_spec(dataset.current.spec) if dataset.current else {}
            initial |= {"name": dataset.name, "description": dataset.description}
        form = DatasetForm(initial=initial)
        # The first numbers come with the page; the page's script refreshes them as it changes.
        preview = (
            dataset_version_preview(edit[0].current)  # its kept count
            if edit and edit[0].current
            else dataset_preview(spec_parse({}), estimate=True)
        )
        status = 200
    return render(
        request,
        "curation/curation.html",
        {
            "form": form,
            "datasets": datasets_list(),
            "preview": preview,
            "counts": live_state(["curation"])["curate"],
            "page": "curation",
            "live_topics": "curation",
        },
        status=status,
    )


def _dataset_save(request: HttpRequest, form: DatasetForm):
    d, actor = form.cleaned_data, request.user.get_username()
    spec = form.spec_raw()
    try:
        return dataset_create(name=d["name"], spec=spec, description=d["description"], actor=actor)
    except Conflict:  # the name exists: edit it (a new version when the spec changed)
        return dataset_update(name=d["name"], spec=spec, description=d["description"], actor=actor)


def _form_field(form: DatasetForm, field: str | None) -> str | None:
    if field in form.fields:
        return field
    if field and field.split(".")[-1].split("[")[0] in form.fields and not form.cleaned_data.get("advanced"):
        return field.split(".")[-1].split("[")[0]
    return "spec" if field and field != "name" else field


@require_POST
@allowed(CURATE)
def curation_preview(request: HttpRequest) -> JsonResponse:
    """POST a spec (JSON): what it admits now (dataset_preview), or 400 naming the field."""
    try:
        raw = json.loads(request.body or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return JsonResponse({"error": f"the body is not JSON: {exc}", "field": "spec"}, status=400)
    try:
        with replica_reads():  # a read-only POST: the spec travels in the body
            preview = dataset_preview(spec_parse(raw), estimate=True)
    except InvalidInput as exc:
        return JsonResponse({"error": exc.message, "field": exc.field}, status=400)
    return JsonResponse(preview)


@allowed(CURATE)
@replica_view
def dataset(request: HttpRequest, name: str) -> HttpResponse:
    found = dataset_versions(name)
    if found is None:
        raise Http404("no such dataset")
    ds, versions = found
    preview = dataset_version_preview(ds.current) if ds.current else None
    return render(
        request,
        "curation/dataset.html",
        {
            "dataset": ds,
            "versions": [(v, json.dumps(v.spec, indent=2)) for v in versions],
            "preview": preview,
            "serving": serving_summary(spec_parse(ds.current.spec).serving) if ds.current else [],
        },
    )
