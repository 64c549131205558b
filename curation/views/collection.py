"""Collect and represent: the overview, the collection page, the trajectory and step browsers,
one trajectory's trace and one step's inspector (with its token ids)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods

from pool.errors import InvalidInput
from pool.replica import replica_view

from .. import charts
from ..forms import (
    LabelForm,
    StepFilterForm,
    TrajectoryFilterForm,
)
from ..selectors import lineage
from ..selectors.pages import overview, policy_current, sources_health, steps_browse, trajectories_browse
from ..selectors.timeline import step_inspect, step_token_ids, trajectory_timeline
from ..services.labels import trajectories_label
from .access import CURATE, VIEW, _require, allowed
from .consumption import STEP_CHECKPOINTS_SHOWN


# --- dashboard: one page per lifecycle stage (collect, represent, curate, optimize, consume) ---
@allowed(VIEW)
@replica_view
def home(request: HttpRequest) -> HttpResponse:
    """Overview: the counters of every stage, the ingestion rate, sources, policy, drift
    and error rates. Live events (static/claw/live.js) move the numbers forward."""
    data = overview()
    chart = charts.line_chart(
        [r["steps"] for r in data["rate"]],
        labels=[timezone.localtime(r["minute"]).strftime("%H:%M") for r in data["rate"]],
        unit="steps/min",
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
    """The collection stage is the trajectory list (one list, live, in the nav): old links
    and bookmarks land there with their filters."""
    query = request.META.get("QUERY_STRING", "")
    return redirect(reverse("curation:trajectories") + (f"?{query}" if query else ""))


@allowed("pool.view_step")
@replica_view
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
@replica_view
def step(request: HttpRequest, step_id: int) -> HttpResponse:
    """The step inspector: prompt and response as text, tokens on demand, token source,
    drift location, reward and feedback."""
    found = step_inspect(step_id)
    if found is None:
        raise Http404("no such step")
    trained = lineage.checkpoints_of(step_id=step_id, runs=None, after=None, limit=STEP_CHECKPOINTS_SHOWN)
    return render(
        request,
        "dashboard/step.html",
        {"i": found, "v": found.view, "s": found.view.step, "checkpoints": trained, "page": "steps"},
    )


# --- trajectories ----------------------------------------------------------------------------
@allowed(VIEW)
@replica_view
def trajectories(request: HttpRequest) -> HttpResponse:
    """Collection: trajectories as they arrive, filtered server-side (live rows obey the same
    filter), and the data sources that wrote them."""
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
            "page": "trajectories",
            "live_topics": "collection",
        },
    )


@require_http_methods(["GET", "POST"])
@allowed(VIEW)
@replica_view
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
                n = trajectories_label(
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
@replica_view
def step_tokens(request: HttpRequest, step_id: int) -> JsonResponse:
    """One step's exact token ids, on demand (the timeline does not load them)."""
    ids = step_token_ids(step_id)
    if ids is None:
        raise Http404("no such step")
    return JsonResponse(ids)
