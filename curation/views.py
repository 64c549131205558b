"""Pages of the pool for people: reviewers view trajectories and give feedback; operators
also label steps, build datasets and create review queues.

Each view validates its input, calls one service or selector and renders. Access is by
permission, never by name: anonymous users are sent to the sign-in page, a signed-in user
without the permission gets 403. Reviewing needs ``pool.add_feedback``; curating (labels,
datasets, queues) ``pool.change_step`` (curation/roles.py gives each role its set).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from pool.errors import Conflict, InvalidInput, NotFound, PoolError
from pool.selectors.tasks import tasks_overview
from pool.services.merge import group_merge_ensure, merge_tree_render

from . import charts, services
from .forms import (
    BatchForm,
    DatasetForm,
    LabelForm,
    QueueForm,
    ReviewForm,
    SnapshotForm,
    StepFilterForm,
    TrajectoryFilterForm,
)
from .selectors.consumption import consumers_health, lease_body, leases_recent, snapshots_recent
from .selectors.live import live_state
from .selectors.optimization import group_get, optimization_overview, prefix_tree_layout
from .selectors.pages import overview, policy_current, sources_health, steps_browse, trajectories_browse
from .selectors.review import review_progress, review_queue_get, review_queues_list
from .selectors.specs import dataset_preview, dataset_versions, datasets_list, datasets_with_current
from .selectors.timeline import step_inspect, step_token_ids, trajectory_timeline
from .services.snapshots import snapshot_create
from .specs import spec_dump, spec_parse

VIEW = "pool.view_trajectory"
REVIEW = "pool.add_feedback"
CURATE = "pool.change_step"
GROUPS = "pool.view_promptgroup"
# Skipped trajectory ids remembered per queue in the session (so Skip moves on), at most.
SKIPS_KEPT = 500


def allowed(perm: str) -> Callable:
    """Signed in (else redirect to /login/) and holding ``perm`` (else 403)."""

    def decorate(view: Callable) -> Callable:
        return login_required(permission_required(perm, raise_exception=True)(view))

    return decorate


def _require(request: HttpRequest, perm: str) -> None:
    if not request.user.has_perm(perm):
        raise PermissionDenied


login = auth_views.LoginView.as_view(template_name="curation/login.html", redirect_authenticated_user=True)
logout = auth_views.LogoutView.as_view()


# --- dashboard: one page per lifecycle stage (collect, represent, curate, optimize, consume) ---
@allowed(VIEW)
def home(request: HttpRequest) -> HttpResponse:
    """Overview: the counters of every stage, the ingestion rate, sources, policy, drift
    and error rates. Live events (static/claw/live.js) move the numbers forward."""
    data = overview()
    chart = charts.line_chart(
        [r["steps"] for r in data["rate"]],
        labels=[timezone.localtime(r["minute"]).strftime("%H:%M") for r in data["rate"]],
    )
    return render(
        request,
        "dashboard/overview.html",
        {
            **data,
            "chart": chart,
            "policy": policy_current(),
            "page": "overview",
            "live_topics": "overview",
        },
    )


@allowed(VIEW)
def collection(request: HttpRequest) -> HttpResponse:
    """Trajectories as they arrive, filtered server-side; live rows obey the same filter."""
    form = TrajectoryFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    rows, next_before = trajectories_browse(
        status=filters.get("status", ""),
        channel=filters.get("channel", ""),
        source=filters.get("source", ""),
        group=filters.get("group", ""),
        has_ready=filters.get("has_ready", False),
        before=filters.get("before"),
    )
    return render(
        request,
        "dashboard/collection.html",
        {
            "form": form,
            "rows": rows,
            "next_before": next_before,
            "paged": bool(filters.get("before")),
            "sources": sources_health(),
            "live_filter": {k: filters.get(k) or "" for k in ("status", "channel", "source", "group")},
            # Live rows are only prepended to the first page, and not when "has ready" is on
            # (readiness is not in the events).
            "live_rows": not filters.get("before") and not filters.get("has_ready"),
            "page": "collection",
            "live_topics": "collection",
        },
    )


@allowed("pool.view_step")
def steps(request: HttpRequest) -> HttpResponse:
    """Representation: the newest steps with their token source and drift."""
    form = StepFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    rows, next_before = steps_browse(
        source=filters.get("source", ""),
        token_source=filters.get("token_source", ""),
        drift=filters.get("drift", False),
        before=filters.get("before"),
    )
    return render(
        request,
        "dashboard/steps.html",
        {
            "form": form,
            "rows": rows,
            "next_before": next_before,
            "paged": bool(filters.get("before")),
            "live_filter": {
                "source": filters.get("source") or "",
                "token_source": filters.get("token_source") or "",
                "drift": "1" if filters.get("drift") else "",
            },
            "live_rows": not filters.get("before"),
            "page": "steps",
            "live_topics": "steps",
        },
    )


@allowed("pool.view_step")
def step(request: HttpRequest, step_id: int) -> HttpResponse:
    """The step inspector: prompt and response as text, tokens on demand, token source,
    drift location, reward and feedback."""
    found = step_inspect(step_id)
    if found is None:
        raise Http404("no such step")
    return render(
        request, "dashboard/step.html", {"i": found, "v": found.view, "s": found.view.step, "page": "steps"}
    )


@allowed(GROUPS)
def optimization(request: HttpRequest) -> HttpResponse:
    """Prompt groups with their prefix-tree savings, and the savings chart."""
    before = _int(request.GET.get("before"))
    data = optimization_overview(before=before)
    merged = [r for r in data["rows"] if r["tokens"]]
    chart = charts.bar_chart([(r["group"].uid, r["saved"], r["tokens"]) for r in merged[:25]])
    return render(
        request,
        "dashboard/optimization.html",
        {
            **data,
            "chart": chart,
            "paged": before is not None,
            "page": "optimization",
            "live_topics": "optimization",
        },
    )


@allowed(GROUPS)
def group_tree(request: HttpRequest, uid: str) -> HttpResponse:
    """One group's prefix tree (the API's groups/<uid>/prefix-tree, drawn): shared spans,
    branches and the steps through each. A small group is merged during the request; a
    large one is queued and the page says so."""
    group = group_get(uid)
    if group is None:
        raise Http404("no such prompt group")
    body = merge_tree_render(group_merge_ensure(uid=uid))
    return render(
        request,
        "dashboard/group.html",
        {
            "group": group,
            "merge": body,
            "layout": prefix_tree_layout(body),
            "page": "optimization",
            "live_topics": "optimization",
        },
    )


@require_http_methods(["GET", "POST"])
@allowed(VIEW)
def consumption(request: HttpRequest) -> HttpResponse:
    """Batch configuration with its preview, snapshots (live progress), consumers with lag
    and leases, and replayable batches. A POST (operators) requests a snapshot."""
    names = [d.name for d in datasets_with_current()]
    snapshot_form = SnapshotForm(datasets=names)
    status = 200
    if request.method == "POST":
        _require(request, CURATE)
        snapshot_form = SnapshotForm(request.POST, datasets=names)
        if snapshot_form.is_valid():
            try:
                snap = snapshot_create(
                    dataset=snapshot_form.cleaned_data["dataset"], actor=request.user.get_username()
                )
            except PoolError as exc:
                snapshot_form.add_error("dataset", exc.message)
            else:
                messages.success(request, f"Snapshot {snap.id} requested.")
                return redirect(reverse("curation:consumption") + "#snapshots")
        status = 400
    form = BatchForm(request.GET or None, datasets=names)
    config = _batch_config(form, names)
    return render(
        request,
        "dashboard/consumption.html",
        {
            "form": form,
            "config": config,
            "snapshot_form": snapshot_form,
            "snapshots": snapshots_recent(),
            "consumers": consumers_health(),
            "leases": leases_recent(),
            "page": "consumption",
            "live_topics": "consumption",
        },
        status=status,
    )


def _batch_config(form: BatchForm, names: list[str]) -> dict[str, Any] | None:
    """The chosen batch (defaults: the first dataset, 64 groups, steps format), its pull
    request body and a preview of what its dataset admits under the freshness bound."""
    if not names:
        return None
    d = form.cleaned_data if form.is_bound and form.is_valid() else {}
    name = d.get("dataset") or names[0]
    found = dataset_versions(name)
    if found is None or found[0].current is None:
        return None
    spec = spec_dump(spec_parse(found[0].current.spec))
    if d.get("max_staleness") is not None:
        spec["filters"]["max_staleness"] = d["max_staleness"]
    unit = d.get("unit") or ("groups" if spec["grouping"]["keep_groups_whole"] else "steps")
    pull = {
        "dataset": name,
        "batch_size": d.get("batch_size") or 64,
        "unit": unit,
        "format": d.get("format") or "steps",
    }
    return {
        "dataset": found[0],
        "pull": pull,
        "pull_json": json.dumps(pull),
        "max_staleness": spec["filters"]["max_staleness"],
        "preview": dataset_preview(spec_parse(spec)),
    }


@allowed(VIEW)
def lease_batch(request: HttpRequest, lease_id: uuid.UUID) -> HttpResponse:
    """Replay: a lease's batch exactly as first served (the API's leases/<id>/batch, for
    people signed in to the pages)."""
    body = lease_body(lease_id)
    if body is None:
        raise Http404("no such lease")
    return HttpResponse(body, content_type="application/json")


# --- trajectories ----------------------------------------------------------------------------
@allowed(VIEW)
def trajectories(request: HttpRequest) -> HttpResponse:
    form = TrajectoryFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    rows, next_before = trajectories_browse(
        status=filters.get("status", ""),
        channel=filters.get("channel", ""),
        source=filters.get("source", ""),
        group=filters.get("group", ""),
        has_ready=filters.get("has_ready", False),
        before=filters.get("before"),
    )
    return render(
        request,
        "curation/trajectories.html",
        {"form": form, "rows": rows, "next_before": next_before, "paged": bool(filters.get("before"))},
    )


@require_http_methods(["GET", "POST"])
@allowed(VIEW)
def trajectory(request: HttpRequest, uid: str) -> HttpResponse:
    """The step timeline; a POST is an operator's label change on every step."""
    timeline = trajectory_timeline(uid)
    if timeline is None:
        raise Http404("no such trajectory")
    form = LabelForm()
    if request.method == "POST":
        _require(request, CURATE)
        form = LabelForm(request.POST)
        if form.is_valid():
            try:
                n = services.trajectories_label(
                    trajectory_ids=[timeline["trajectory"].id],
                    actor=request.user.get_username(),
                    user_id=request.user.pk,
                    **form.change(),
                )
            except InvalidInput as exc:
                form.add_error(None, exc.message)
            else:
                messages.success(request, f"{n} step(s) changed.")
                return redirect(request.path)
    return render(
        request,
        "curation/trajectory.html",
        {**timeline, "label_form": form},
        status=400 if form.errors else 200,
    )


@allowed("pool.view_step")
def step_tokens(request: HttpRequest, step_id: int) -> JsonResponse:
    """One step's exact token ids, on demand (the timeline does not load them)."""
    ids = step_token_ids(step_id)
    if ids is None:
        raise Http404("no such step")
    return JsonResponse(ids)


# --- curation --------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
@allowed(CURATE)
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
        preview = dataset_preview(spec_parse(edit[0].current.spec if edit and edit[0].current else {}))
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
        return services.dataset_create(name=d["name"], spec=spec, description=d["description"], actor=actor)
    except Conflict:  # the name exists: edit it (a new version when the spec changed)
        return services.dataset_update(name=d["name"], spec=spec, description=d["description"], actor=actor)


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
        preview = dataset_preview(spec_parse(raw))
    except InvalidInput as exc:
        return JsonResponse({"error": exc.message, "field": exc.field}, status=400)
    return JsonResponse(preview)


@allowed(CURATE)
def dataset(request: HttpRequest, name: str) -> HttpResponse:
    found = dataset_versions(name)
    if found is None:
        raise Http404("no such dataset")
    ds, versions = found
    preview = dataset_preview(spec_parse(ds.current.spec)) if ds.current else None
    return render(
        request,
        "curation/dataset.html",
        {
            "dataset": ds,
            "versions": [(v, json.dumps(v.spec, indent=2)) for v in versions],
            "preview": preview,
        },
    )


# --- review ----------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
@allowed(REVIEW)
def review(request: HttpRequest, queue: str | None = None) -> HttpResponse:
    """The queue's next item, claimed at once, with its feedback form. POST: submit (then
    the next item) or skip (give it back and move on)."""
    default = services.review_queue_default()  # idempotent: the default queue always exists
    q = default if queue in (None, default.name) else review_queue_get(queue)
    if q is None:
        raise Http404("no such review queue")
    skipped_key = f"review-skipped-{q.pk}"
    skipped: list[int] = request.session.get(skipped_key, [])
    form = None
    if request.method == "POST":
        action = request.POST.get("action")
        claim_id = _int(request.POST.get("claim"))
        if action == "restart":
            request.session.pop(skipped_key, None)
            return redirect(request.path)
        if claim_id is None:
            messages.error(request, "That review item is missing; here is your next one.")
            return redirect(request.path)
        if action == "skip":
            trajectory_id = _int(request.POST.get("trajectory"))
            services.review_release(claim_id=claim_id, user_id=request.user.pk)
            if trajectory_id is not None:
                request.session[skipped_key] = [*skipped, trajectory_id][-SKIPS_KEPT:]
            return redirect(request.path)
        form = ReviewForm(request.POST, queue=q)
        if form.is_valid():
            d = form.cleaned_data
            try:
                services.review_submit(
                    claim_id=claim_id,
                    user_id=request.user.pk,
                    author=request.user.get_username(),
                    rating=d["rating"],
                    label=d["label"],
                    correction=d.get("correction", ""),
                    comment=d["comment"],
                )
            except (Conflict, NotFound) as exc:
                messages.error(request, exc.message)
                return redirect(request.path)
            except InvalidInput as exc:
                form.add_error(exc.field if exc.field in form.fields else None, exc.message)
            else:
                messages.success(request, "Feedback recorded. Here is the next item.")
                return redirect(request.path)
    claim = services.review_claim_next(queue=q, user_id=request.user.pk, exclude=skipped)
    if form is None or (claim is not None and form.data.get("claim") != str(claim.pk)):
        form = ReviewForm(initial={"claim": claim.pk if claim else None}, queue=q)
    timeline = None
    if claim is not None:
        timeline = trajectory_timeline(trajectory_id=claim.trajectory_id)
    return render(
        request,
        "curation/review.html",
        {
            "queue": q,
            "claim": claim,
            "form": form,
            "timeline": timeline,
            "progress": review_progress(q),
            "skipped": len(skipped),
        },
        status=400 if form.errors else 200,
    )


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@require_http_methods(["GET", "POST"])
@allowed(REVIEW)
def review_queues(request: HttpRequest) -> HttpResponse:
    """Every queue with its progress; operators create queues here."""
    services.review_queue_default()  # listed even before anyone reviewed
    datasets = [(d.id, d.name) for d in datasets_list()]
    form = QueueForm(datasets=datasets)
    if request.method == "POST":
        _require(request, CURATE)
        form = QueueForm(request.POST, datasets=datasets)
        if form.is_valid():
            try:
                q = services.review_queue_create(**form.queue_kwargs())
            except PoolError as exc:
                field = exc.field if exc.field in form.fields else None
                form.add_error(
                    field, f"{exc.field}: {exc.message}" if exc.field and not field else exc.message
                )
            else:
                messages.success(request, f"Queue {q.name} created.")
                return redirect(reverse("curation:review_queue", args=[q.name]))
    return render(
        request,
        "curation/review_queues.html",
        {"queues": review_queues_list(), "form": form},
        status=400 if form.errors else 200,
    )


# --- tasks: what groups roll out, and how each task fares ----------------------------------------
@allowed(VIEW)
def tasks(request: HttpRequest) -> HttpResponse:
    """The tasks page: solved / hopeless / informative counts (equal to GET /api/v1/tasks
    ?bucket=...), the pass-rate histogram and the most informative tasks; ``?format=json``
    is the counts alone (the page's live refresh on each ``readiness`` event)."""
    data = tasks_overview(set_name=request.GET.get("set") or None)
    if request.GET.get("format") == "json":
        return JsonResponse({"buckets": data["buckets"], "bins": data["bins"]})
    return render(request, "curation/tasks.html", {**data, "page": "tasks", "live_topics": "consumption"})
