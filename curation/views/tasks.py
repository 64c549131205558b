"""The tasks page: what groups roll out, and how each task fares."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from pool.replica import replica_view
from pool.selectors.tasks import tasks_overview

from .access import VIEW, allowed


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
