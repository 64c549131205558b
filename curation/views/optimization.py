"""Optimize: prompt groups with their prefix-tree merges, and one merge laid out."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from pool.replica import replica_view
from pool.services.merge import group_merge_ensure, merge_tree_render

from .. import charts
from ..selectors.optimization import group_get, optimization_overview, prefix_tree_layout
from .access import GROUPS, _int, allowed


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
