"""Consume: consumers, leases and snapshots; training runs, their checkpoints, and the diffs
of datasets and snapshots (lineage)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from claw_kit.web.files import stream_download
from pool.errors import PoolError
from pool.replica import replica_view

from .. import charts
from ..forms import (
    BatchForm,
    SnapshotForm,
)
from ..selectors import diffs, lineage
from ..selectors.consumption import (
    consumers_health,
    lease_body,
    leases_recent,
    snapshot_get,
    snapshots_recent,
)
from ..selectors.specs import dataset_preview, dataset_versions, datasets_with_current
from ..services.counts import dataset_version_preview
from ..services.snapshots import snapshot_create
from ..specs import serving_summary, spec_dump, spec_parse
from .access import CURATE, VIEW, _int, _require, _wants_html, allowed

# Lineage pages: runs per page, checkpoints drawn on a run's page, rows per page of a
# checkpoint's steps or of a diff's side, checkpoints listed on a step's page.
RUNS_SHOWN, CHECKPOINTS_SHOWN, ROWS_SHOWN, STEP_CHECKPOINTS_SHOWN = 50, 1000, 100, 50


RUNS_RECENT = 5  # on the consumption page


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
        # the dataset's kept count, unless the form's freshness bound makes it another spec
        "preview": dataset_version_preview(found[0].current)
        if d.get("max_staleness") is None
        else dataset_preview(spec_parse(spec), estimate=True),
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
    found = lease_body(lease_id)
    if found is None:
        raise Http404("no such lease")
    body, dropped = found  # past its replay window: the manifest, "batch": null
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
        {
            "lease_id": lease_id,
            "batch": parsed,
            "size": len(body),
            "dropped": dropped,
            "replay_days": settings.CLAW_RETENTION_REPLAY_DAYS,
            "page": "consumption",
        },
    )
