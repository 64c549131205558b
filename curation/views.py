"""Pages of the pool for people: reviewers view trajectories and give feedback; operators
also label steps, build datasets and create review queues.

Each view validates its input, calls one service or selector and renders. Access is by
permission, never by name: anonymous users are sent to the sign-in page, a signed-in user
without the permission gets 403. Reviewing needs ``pool.add_feedback``; curating (labels,
datasets, queues) ``pool.change_step`` (curation/roles.py gives each role its set).

With a read replica configured (DATABASE_REPLICA_URL), the pages marked ``replica_view`` are
read from it on GET (and say so, with its lag); their forms that write, the review pages
(claims are writes), a prefix tree merged on demand and a lease's replay read the primary
(pool/replica.py).
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

from claw_kit.web.files import stream_download
from pool.errors import Conflict, InvalidInput, NotFound, PoolError
from pool.replica import replica_reads, replica_view
from pool.selectors.tasks import tasks_overview
from pool.services.merge import group_merge_ensure, merge_tree_render

from . import charts, services
from .forms import (
    BatchForm,
    DatasetForm,
    GroupReviewForm,
    LabelForm,
    QueueFilterForm,
    QueueForm,
    ReviewForm,
    SnapshotForm,
    StepFilterForm,
    TrajectoryFilterForm,
)
from .markdown import markdown_html
from .selectors import diffs, lineage
from .selectors.consumption import (
    consumers_health,
    lease_body,
    leases_recent,
    snapshot_get,
    snapshots_recent,
)
from .selectors.live import live_state
from .selectors.optimization import group_get, optimization_overview, prefix_tree_layout
from .selectors.pages import overview, policy_current, sources_health, steps_browse, trajectories_browse
from .selectors.review import (
    review_agreement,
    review_claim_group,
    review_group_view,
    review_progress,
    review_queue_get,
    review_queues_list,
    review_reviewers,
    review_rollouts,
)
from .selectors.specs import dataset_preview, dataset_versions, datasets_list, datasets_with_current
from .selectors.timeline import step_inspect, step_token_ids, trajectory_timeline
from .services.snapshots import snapshot_create
from .specs import serving_summary, spec_dump, spec_parse

VIEW = "pool.view_trajectory"
REVIEW = "pool.add_feedback"
CURATE = "pool.change_step"
GROUPS = "pool.view_promptgroup"
# Skipped trajectory ids remembered per queue in the session (so Skip moves on), at most.
SKIPS_KEPT = 500
# Lineage pages: runs per page, checkpoints drawn on a run's page, rows per page of a
# checkpoint's steps or of a diff's side, checkpoints listed on a step's page.
RUNS_SHOWN, CHECKPOINTS_SHOWN, ROWS_SHOWN, STEP_CHECKPOINTS_SHOWN = 50, 1000, 100, 50
RUNS_RECENT = 5  # on the consumption page


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


@allowed(GROUPS)
@replica_view
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
@replica_view
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
            "runs": lineage.runs_page(sources=None, after=None, limit=RUNS_RECENT),
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
        "serving": serving_summary(spec_parse(spec).serving),
    }


# --- lineage: training runs, their checkpoints, and what changed ------------------------------
@allowed(VIEW)
def runs(request: HttpRequest) -> HttpResponse:
    """Training runs, newest first (``?before=<id>``: the next page)."""
    rows = lineage.runs_page(sources=None, after=_int(request.GET.get("before")), limit=RUNS_SHOWN)
    return render(
        request,
        "dashboard/runs.html",
        {
            "runs": rows,
            "next_before": rows[-1].id if len(rows) == RUNS_SHOWN else None,
            "page": "consumption",
        },
    )


@allowed(VIEW)
def run(request: HttpRequest, uid: str) -> HttpResponse:
    """A run: its checkpoints on a timeline (the mean reward of the data behind each, drawn
    on the server), its sources and tasks, each checkpoint a link to its steps."""
    found = lineage.run_get(uid, sources=None)
    if found is None:
        raise Http404("no such run")
    cps = lineage.run_checkpoints(found, after=None, limit=CHECKPOINTS_SHOWN)
    chart = charts.timeline_chart(
        [
            {
                "at": c.created_at,
                "value": c.reward_mean,
                "label": f"v{c.version}",
                "href": reverse("curation:checkpoint", args=[found.uid, c.version]),
            }
            for c in cps
        ],
        unit="mean reward",
    )
    return render(
        request,
        "dashboard/run.html",
        {
            "run": found,
            "checkpoints": cps,
            "chart": chart,
            "summary": lineage.run_summary(found),
            "unclaimed": lineage.unclaimed_acks(found),
            "config": json.dumps(found.config, indent=2, sort_keys=True),
            "page": "consumption",
        },
    )


@allowed(VIEW)
def checkpoint(request: HttpRequest, uid: str, version: int) -> HttpResponse:
    """A checkpoint: what is behind it (leases, sources, tasks, dataset versions), its steps
    in order (``?after=<position>``: the next page), and with ``?to=<version>`` how another
    checkpoint's data differs from it."""
    found = lineage.run_get(uid, sources=None)
    cp = lineage.checkpoint_get(found, version) if found is not None else None
    if found is None or cp is None:
        raise Http404("no such checkpoint")
    rows = lineage.checkpoint_steps(cp, sources=None, after=_int(request.GET.get("after")), limit=ROWS_SHOWN)
    other = _int(request.GET.get("to"))
    diff = None
    if other is not None:
        b = lineage.checkpoint_get(found, other)
        if b is None:
            messages.error(request, f"Run {found.uid} has no checkpoint {other}.")
        else:
            diff = {
                "to": b,
                "counts": lineage.checkpoints_diff_counts(cp, b, sources=None),
                **{
                    side: lineage.checkpoints_diff_page(
                        cp, b, side=side, sources=None, after=None, limit=ROWS_SHOWN
                    )
                    for side in ("added", "removed")
                },
            }
    return render(
        request,
        "dashboard/checkpoint.html",
        {
            "run": found,
            "cp": cp,
            "summary": lineage.checkpoint_summary(cp, sources=None),
            "rows": rows,
            "next_after": rows[-1]["position"] if len(rows) == ROWS_SHOWN else None,
            "diff": diff,
            "others": [
                c.version for c in lineage.run_checkpoints(found, after=None, limit=CHECKPOINTS_SHOWN)
            ],
            "page": "consumption",
        },
    )


@allowed(VIEW)
def checkpoint_step_uids(request: HttpRequest, uid: str, version: int) -> HttpResponse:
    """Every step uid behind a checkpoint, one per line (the page's download; the API's is
    GET /api/v1/runs/{uid}/checkpoints/{version}/steps/download)."""
    found = lineage.run_get(uid, sources=None)
    cp = lineage.checkpoint_get(found, version) if found is not None else None
    if found is None or cp is None:
        raise Http404("no such checkpoint")
    return stream_download(
        request,
        (u.encode() + b"\n" for u in lineage.checkpoint_step_uids(cp, sources=None)),
        content_type="text/plain; charset=utf-8",
        filename=f"{found.uid}-{cp.version}-steps.txt",
    )


@allowed(CURATE)
def dataset_diff(request: HttpRequest, name: str) -> HttpResponse:
    """Two versions of a dataset (``?from=&to=``; default: the one before the current, and
    the current): what each admits now, compared; one side listed (``?side=``)."""
    found = dataset_versions(name)
    if found is None:
        raise Http404("no such dataset")
    ds, versions = found
    by_number = {v.version: v for v in versions}
    numbers = sorted(by_number)
    to = _int(request.GET.get("to")) or numbers[-1]
    frm = _int(request.GET.get("from")) or (numbers[-2] if len(numbers) > 1 else numbers[-1])
    side = request.GET.get("side", "added")
    if frm not in by_number or to not in by_number or side not in diffs.VERSION_SIDES:
        raise Http404("no such version or side")
    d = diffs.versions_diff(
        by_number[frm],
        by_number[to],
        sources=None,
        side=side,
        after=_int(request.GET.get("after")),
        limit=ROWS_SHOWN,
    )
    return render(
        request,
        "curation/diff.html",
        {
            "title": f"Dataset {ds.name}: v{frm} → v{to}",
            "back": (reverse("curation:dataset", args=[ds.name]), f"« Dataset {ds.name}"),
            "counts": d.counts,
            "tabs": [(side, d.counts[side]) for side in diffs.VERSION_SIDES],
            "side": side,
            "results": d.results,
            "next_after": d.last if len(d.results) == ROWS_SHOWN else None,
            "choices": {"from": numbers, "to": numbers},
            "picked": {"from": frm, "to": to},
            "page": "curation",
        },
    )


@allowed(VIEW)
def snapshot_diff(request: HttpRequest, snapshot_id: uuid.UUID) -> HttpResponse:
    """Two snapshots (this one, and ``?to=<id>``; default: the done one of the same dataset
    made just before, compared to this one): steps added, removed, and those whose reward,
    quality flags or review changed; one side listed (``?side=``)."""
    snap = snapshot_get(snapshot_id)
    if snap is None:
        raise Http404("no such snapshot")
    raw = request.GET.get("to")
    if raw:
        try:
            other = snapshot_get(uuid.UUID(raw))
        except ValueError:
            other = None
        a, b = snap, other
    else:
        a, b = lineage.snapshot_previous(snap), snap
    side = request.GET.get("side", "added")
    if side not in diffs.SNAPSHOT_SIDES:
        raise Http404("no such side")
    d = None
    if a is not None and b is not None and a.status == b.status == "done":
        d = diffs.snapshots_diff(a, b, side=side, after=request.GET.get("after") or None, limit=ROWS_SHOWN)
    return render(
        request,
        "curation/diff.html",
        {
            "title": f"Snapshot {str(snap.id)[:8]} ({snap.dataset_version})",
            "back": (reverse("curation:consumption") + "#snapshots", "« Consumption"),
            "snapshots": (a, b),
            "counts": d.counts if d else None,
            "tabs": [(s, d.counts[s]) for s in diffs.SNAPSHOT_SIDES] if d else [],
            "side": side,
            "results": d.results if d else [],
            "next_after": d.last if d and len(d.results) == ROWS_SHOWN else None,
            "picked": {"to": raw or ""},
            "page": "consumption",
        },
    )


@allowed(VIEW)
def lease_batch(request: HttpRequest, lease_id: uuid.UUID) -> HttpResponse:
    """Replay: a lease's batch exactly as first served (the API's leases/<id>/batch, for
    people signed in to the pages)."""
    body = lease_body(lease_id)
    if body is None:
        raise Http404("no such lease")
    if not _wants_html(request):
        return HttpResponse(body, content_type="application/json")
    # A browser: the same bytes drawn as a formatted tree, with the JSON a link away.
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return HttpResponse(body, content_type="application/json")
    return render(
        request,
        "dashboard/lease_batch.html",
        {"lease_id": lease_id, "batch": parsed, "size": len(body), "page": "consumption"},
    )


def _wants_html(request: HttpRequest) -> bool:
    """A page, not JSON: ?format=html, or a browser's Accept naming text/html before (or
    instead of) JSON; ?format=json always JSON."""
    fmt = request.GET.get("format")
    if fmt in ("json", "html"):
        return fmt == "html"
    accept = request.headers.get("Accept", "")
    html, js = accept.find("text/html"), accept.find("application/json")
    return html >= 0 and (js < 0 or html < js)


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
@replica_view
def step_tokens(request: HttpRequest, step_id: int) -> JsonResponse:
    """One step's exact token ids, on demand (the timeline does not load them)."""
    ids = step_token_ids(step_id)
    if ids is None:
        raise Http404("no such step")
    return JsonResponse(ids)


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
        with replica_reads():  # a read-only POST: the spec travels in the body
            preview = dataset_preview(spec_parse(raw))
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
    preview = dataset_preview(spec_parse(ds.current.spec)) if ds.current else None
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


# --- review ----------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
@allowed(REVIEW)
def review(request: HttpRequest, queue: str | None = None) -> HttpResponse:
    """The queue's next item, claimed at once, with its feedback form (a group's rollouts
    side by side, to rank, in group mode), the queue's guidelines, hotkeys, progress per
    reviewer and agreement. POST ``action``: submit (then the next item), skip or next
    (give it back and move on), prev (back to the item last skipped), restart (show the
    skipped items again)."""
    default = services.review_queue_default()  # idempotent: the default queue always exists
    q = default if queue in (None, default.name) else review_queue_get(queue)
    if q is None:
        raise Http404("no such review queue")
    skipped_key = f"review-skipped-{q.pk}"
    skipped: list[int] = request.session.get(skipped_key, [])
    form: ReviewForm | GroupReviewForm | None = None
    if request.method == "POST":
        action = request.POST.get("action")
        claim_id = _int(request.POST.get("claim"))
        if action == "restart":
            request.session.pop(skipped_key, None)
            return redirect(request.path)
        if claim_id is None:
            messages.error(request, "That review item is missing; here is your next one.")
            return redirect(request.path)
        if action in ("skip", "next", "prev"):
            item = _int(request.POST.get("item", request.POST.get("trajectory")))
            services.review_release(claim_id=claim_id, user_id=request.user.pk)
            rest = skipped
            if action == "prev":
                # Back to the item last left: this one is given back, not skipped (it comes
                # again in its turn).
                if skipped:
                    request.session[f"review-prefer-{q.pk}"] = skipped[-1]
                    rest = skipped[:-1]
            elif item is not None:
                rest = [*rest, item][-SKIPS_KEPT:]
            request.session[skipped_key] = rest
            return redirect(request.path)
        form = _review_form(q, claim_id, request.POST)
        if form.is_valid():
            try:
                _review_submit(request, q, form)
            except (Conflict, NotFound) as exc:
                messages.error(request, exc.message)
                return redirect(request.path)
            except InvalidInput as exc:
                form.add_error(exc.field if exc.field in form.fields else None, f"{exc.field}: {exc.message}")
            else:
                messages.success(request, "Feedback recorded. Here is the next item.")
                return redirect(request.path)
    prefer = request.session.pop(f"review-prefer-{q.pk}", None)
    exclude = [i for i in skipped if i != prefer]
    claim = services.review_claim_next(queue=q, user_id=request.user.pk, exclude=exclude, prefer=prefer)
    if prefer is not None:
        request.session[skipped_key] = exclude
    if form is None or claim is None or form.data.get("claim") != str(claim.pk):
        form = _review_form(q, claim.pk if claim else None, None)
    timeline = group = None
    if claim is not None and q.is_group and claim.group_id is not None:
        group = review_group_view(q, claim.group_id)
    elif claim is not None:
        timeline = trajectory_timeline(trajectory_id=claim.trajectory_id)
    progress = review_progress(q)
    return render(
        request,
        "curation/review.html",
        {
            "queue": q,
            "claim": claim,
            "item": (claim.group_id if q.is_group else claim.trajectory_id) if claim else None,
            "form": form,
            "timeline": timeline,
            "group": group,
            "guidelines": markdown_html(q.guidelines) if q.guidelines else "",
            "progress": progress,
            "reviewers": review_reviewers(q, total=progress["total"]),
            "agreement": review_agreement(q) if q.reviews_per_item > 1 else None,
            "skipped": len(skipped),
            "page": "review",
        },
        status=400 if form.errors else 200,
    )


def _review_form(q: Any, claim_id: int | None, data: Any) -> ReviewForm | GroupReviewForm:
    """The item's form: ratings and labels, or in group mode a rank per rollout."""
    if q.is_group:
        group_id = review_claim_group(claim_id) if claim_id else None
        rollouts = review_rollouts(q, group_id) if group_id else []
        return GroupReviewForm(data, initial={"claim": claim_id}, queue=q, rollouts=rollouts)
    return ReviewForm(data, initial={"claim": claim_id}, queue=q)


def _review_submit(request: HttpRequest, q: Any, form: ReviewForm | GroupReviewForm) -> None:
    d = form.cleaned_data
    who = {"claim_id": d["claim"], "user_id": request.user.pk, "author": request.user.get_username()}
    if isinstance(form, GroupReviewForm):
        services.review_submit_group(**who, ranking=form.ranking(), comment=d["comment"])
        return
    services.review_submit(
        **who,
        rating=d["rating"],
        labels=form.labels(),
        correction=d.get("correction", ""),
        comment=d["comment"],
    )


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@require_http_methods(["GET", "POST"])
@allowed(REVIEW)
def review_queues(request: HttpRequest) -> HttpResponse:
    """Every queue with its progress; operators create queues here, and edit one with
    ``?edit=<name>`` (its words, guidelines, scope and reviews per item). The scope is
    chosen with the dataset builder's filter fields (QueueFilterForm, as on /curation/)."""
    services.review_queue_default()  # listed even before anyone reviewed
    datasets = [(d.id, d.name) for d in datasets_list()]
    editing = review_queue_get(request.GET["edit"]) if request.GET.get("edit") else None
    if request.GET.get("edit") and editing is None:
        raise Http404("no such review queue")
    edit = editing is not None
    if editing is not None:
        _require(request, CURATE)
        initial = {
            "description": editing.description,
            "guidelines": editing.guidelines,
            "dataset": str(editing.dataset_id or ""),
            "reviews_per_item": editing.reviews_per_item,
        }
        form = QueueForm(initial=initial, datasets=datasets, edit=True)
        filters = QueueFilterForm(initial=QueueFilterForm.initial_from_spec({"filters": editing.filters}))
    else:
        form = QueueForm(datasets=datasets)
        filters = QueueFilterForm()
    if request.method == "POST":
        _require(request, CURATE)
        form = QueueForm(request.POST, datasets=datasets, edit=edit)
        filters = QueueFilterForm(request.POST)
        if form.is_valid() and filters.is_valid():
            try:
                spec_filters = filters.filters()
                if editing is not None:
                    q = services.review_queue_update(queue_id=editing.id, **form.update_kwargs(spec_filters))
                else:
                    q = services.review_queue_create(**form.queue_kwargs(spec_filters))
            except PoolError as exc:
                field = exc.field if exc.field in form.fields else None
                form.add_error(
                    field, f"{exc.field}: {exc.message}" if exc.field and not field else exc.message
                )
            else:
                messages.success(request, f"Queue {q.name} {'saved' if edit else 'created'}.")
                return redirect(reverse("curation:review_queue", args=[q.name]))
    return render(
        request,
        "curation/review_queues.html",
        {
            "queues": review_queues_list(),
            "form": form,
            "filters": filters,
            "editing": editing,
            "preview": dataset_preview(spec_parse({"filters": editing.filters if editing else {}})),
            "page": "review",
        },
        status=400 if form.errors or filters.errors else 200,
    )


# --- images (issue 24): thumbnails and full images for the pages -------------------------------
# Served with their checked raster type, nosniff, a filename and a sandboxing CSP, so a
# hostile file opened on its own (only PNG, JPEG, WebP and GIF pass ingest) is never active.
_MEDIA_CSP = "default-src 'none'; img-src 'self'; sandbox"


def _media_headers(response: HttpResponse, filename: str, *, inline: bool = True) -> HttpResponse:
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = f'{"inline" if inline else "attachment"}; filename="{filename}"'
    response["Content-Security-Policy"] = _MEDIA_CSP
    # Content-addressed: the same URL is the same bytes forever; private: signed-in users only.
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    return response


def _media_or_404(sha256: str):
    from pool.selectors.media import media_get

    media = media_get(sha256=sha256, sources=None) if len(sha256) == 64 else None
    if media is None:
        raise Http404("no such image")
    return media


@allowed("pool.view_step")
def media_thumb(request: HttpRequest, sha256: str) -> HttpResponse:
    """A stored image's small WebP (made on first request, then kept under thumbs/)."""
    from .services.media_thumbs import THUMB_TYPE, thumbnail_ensure

    media = _media_or_404(sha256)
    return _media_headers(
        HttpResponse(thumbnail_ensure(media=media), content_type=THUMB_TYPE), f"{media.sha256}-thumb.webp"
    )


@allowed("pool.view_step")
def media_full(request: HttpRequest, sha256: str) -> HttpResponse:
    """A stored image as stored, with its checked type (a raster type; anything else would
    be served as a download)."""
    from claw_kit.web.files import file_download
    from pool.services.media import MEDIA_TYPES, media_file

    media = _media_or_404(sha256)
    raster = media.media_type in MEDIA_TYPES.values()
    ext = media.media_type.split("/")[-1] if raster else "bin"
    response = file_download(
        request, media_file(media), content_type=media.media_type if raster else "application/octet-stream"
    )
    response["Content-Length"] = str(media.byte_size)
    return _media_headers(response, f"{media.sha256}.{ext}", inline=raster)


# --- tasks: what groups roll out, and how each task fares ----------------------------------------
@allowed(VIEW)
@replica_view
def tasks(request: HttpRequest) -> HttpResponse:
    """The tasks page: solved / hopeless / informative counts (equal to GET /api/v1/tasks
    ?bucket=...), the pass-rate histogram and the most informative tasks; ``?format=json``
    is the counts alone (the page's live refresh on each ``readiness`` event)."""
    data = tasks_overview(set_name=request.GET.get("set") or None)
    if request.GET.get("format") == "json":
        return JsonResponse({"buckets": data["buckets"], "bins": data["bins"]})
    return render(request, "curation/tasks.html", {**data, "page": "tasks", "live_topics": "consumption"})
