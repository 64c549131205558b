"""Review: the workbench (one item or one group at a time) and the review queues."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from pool.errors import Conflict, InvalidInput, NotFound, PoolError

from ..forms import (
    GroupReviewForm,
    QueueFilterForm,
    QueueForm,
    ReviewForm,
)
from ..markdown import markdown_html
from ..selectors.review import (
    review_agreement,
    review_claim_group,
    review_group_view,
    review_progress,
    review_queue_get,
    review_queues_list,
    review_reviewers,
    review_rollouts,
)
from ..selectors.specs import dataset_preview, datasets_list
from ..selectors.timeline import trajectory_timeline
from ..services.review import (
    review_queue_create,
    review_queue_default,
    review_queue_update,
    review_submit,
    review_submit_group,
)
from ..services.review_navigation import MOVES, ReviewNavigation
from ..specs import spec_parse
from .access import CURATE, REVIEW, _int, _require, allowed


# --- review ----------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
@allowed(REVIEW)
def review(request: HttpRequest, queue: str | None = None) -> HttpResponse:
    """The queue's next item, claimed at once, with its feedback form (a group's rollouts
    side by side, to rank, in group mode), the queue's guidelines, hotkeys, progress per
    reviewer and agreement. POST ``action``: submit (then the next item), skip or next
    (give it back and move on), prev (back to the item last skipped), restart (show the
    skipped items again)."""
    default = review_queue_default()  # idempotent: the default queue always exists
    q = default if queue in (None, default.name) else review_queue_get(queue)
    if q is None:
        raise Http404("no such review queue")
    way = ReviewNavigation(request.session, q, request.user.pk)
    form: ReviewForm | GroupReviewForm | None = None
    if request.method == "POST":
        action = request.POST.get("action")
        claim_id = _int(request.POST.get("claim"))
        if action == "restart":
            way.restart()
            return redirect(request.path)
        if claim_id is None:
            messages.error(request, "That review item is missing; here is your next one.")
            return redirect(request.path)
        if action in MOVES:
            way.move(
                action, claim_id=claim_id, item=_int(request.POST.get("item", request.POST.get("trajectory")))
            )
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
    claim = way.claim()
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
            "skipped": len(way.skipped),
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
        review_submit_group(**who, ranking=form.ranking(), comment=d["comment"])
        return
    review_submit(
        **who,
        rating=d["rating"],
        labels=form.labels(),
        correction=d.get("correction", ""),
        comment=d["comment"],
    )


@require_http_methods(["GET", "POST"])
@allowed(REVIEW)
def review_queues(request: HttpRequest) -> HttpResponse:
    """Every queue with its progress; operators create queues here, and edit one with
    ``?edit=<name>`` (its words, guidelines, scope and reviews per item). The scope is
    chosen with the dataset builder's filter fields (QueueFilterForm, as on /curation/)."""
    review_queue_default()  # listed even before anyone reviewed
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
                    q = review_queue_update(queue_id=editing.id, **form.update_kwargs(spec_filters))
                else:
                    q = review_queue_create(**form.queue_kwargs(spec_filters))
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
            "preview": dataset_preview(
                spec_parse({"filters": editing.filters if editing else {}}), estimate=True
            ),
            "page": "review",
        },
        status=400 if form.errors or filters.errors else 200,
    )
