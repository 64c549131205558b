"""Reads of tasks: the one filter vocabulary (GET /api/v1/tasks and the sampler's ``tasks``),
the sorts and keyset pages of the list, and the rendering of a task with its statistics."""

from __future__ import annotations

import base64
import json
from typing import Any

import django_filters as df
from django.db.models import Count, F, Q, QuerySet, Value
from django.db.models.functions import Coalesce

from ..errors import InvalidInput
from ..models import Task
from ..tenancy import Sources

# The histogram's buckets (the tasks page and the API agree on them): a task is solved when
# its pass rate is at least SOLVED, hopeless when at most HOPELESS, informative in between.
SOLVED, HOPELESS = 0.9, 0.1


class TaskFilter(df.FilterSet):
    """The filters of tasks, by query string (GET /api/v1/tasks) or JSON (the sampler)."""

    set = df.CharFilter(field_name="set_name")
    uid = df.CharFilter()
    pass_rate_min = df.NumberFilter(field_name="pass_rate", lookup_expr="gte")
    pass_rate_max = df.NumberFilter(field_name="pass_rate", lookup_expr="lte")
    recent_pass_rate_min = df.NumberFilter(field_name="recent_pass_rate", lookup_expr="gte")
    recent_pass_rate_max = df.NumberFilter(field_name="recent_pass_rate", lookup_expr="lte")
    seen_min = df.NumberFilter(field_name="seen", lookup_expr="gte")
    seen_max = df.NumberFilter(field_name="seen", lookup_expr="lte")
    informative = df.BooleanFilter(method="_informative")
    bucket = df.ChoiceFilter(
        choices=[(b, b) for b in ("unseen", "solved", "hopeless", "informative")], method="_bucket"
    )

    class Meta:
        model = Task
        fields: list[str] = []

    def _informative(self, qs, name, value):
        """Tasks with (True) or without (False) a group whose rewards differ."""
        return qs.filter(informative_groups__gt=0) if value else qs.filter(informative_groups=0)

    def _bucket(self, qs, name, value):
        return qs.filter(bucket_q(value))


def bucket_q(bucket: str) -> Q:
    """The tasks of a histogram bucket, by all-time pass rate."""
    return {
        "unseen": Q(pass_rate__isnull=True),
        "solved": Q(pass_rate__gte=SOLVED),
        "hopeless": Q(pass_rate__lte=HOPELESS),
        "informative": Q(pass_rate__gt=HOPELESS, pass_rate__lt=SOLVED),
    }[bucket]


def task_bucket(pass_rate: float | None) -> str:
    """The bucket of one task (what ``bucket_q`` selects), for a row of the page."""
    if pass_rate is None:
        return "unseen"
    if pass_rate >= SOLVED:
        return "solved"
    return "hopeless" if pass_rate <= HOPELESS else "informative"


def tasks_listed(sources: Sources = None) -> QuerySet[Task]:
    """The tasks a reader may see: its sources' and the shared ones (None: all)."""
    qs = Task.objects.all()
    if sources is not None:
        qs = qs.filter(Q(source__isnull=True) | Q(source_id__in=sorted(sources)))
    return qs


def tasks_filtered(qs: QuerySet[Task], filters: Any, *, field: str = "tasks") -> QuerySet[Task]:
    """``qs`` narrowed by a filter object in the list's vocabulary; a 400 naming the field
    (``tasks.pass_rate_min``) for an unknown or bad one."""
    if filters is None:
        return qs
    if not isinstance(filters, dict):
        raise InvalidInput(f"{field} must be an object of filters", field=field)
    unknown = sorted(set(filters) - set(TaskFilter.base_filters))
    if unknown:
        raise InvalidInput(
            f"unknown filter {unknown[0]!r}; known: {sorted(TaskFilter.base_filters)}",
            field=f"{field}.{unknown[0]}",
        )
    data = {k: ("true" if v is True else "false" if v is False else v) for k, v in filters.items()}
    fs = TaskFilter(data=data, queryset=qs)
    if not fs.is_valid():
        name, errors = next(iter(fs.errors.items()))
        raise InvalidInput(f"{field}.{name}: {errors[0]}", field=f"{field}.{name}")
    return fs.qs


# --- sorts and keyset pages ------------------------------------------------------------------------
SORTS = {  # name -> (expression, null stand-in): every sort is keyset-paged on (key, id)
    "uid": ("uid", None),
    "pass_rate": ("pass_rate", -1.0),
    "recent_pass_rate": ("recent_pass_rate", None),
    "score": ("score", None),
    "seen": ("seen", None),
    "last_policy_version": ("last_policy_version", -1),
    "created": ("id", None),
}


def tasks_page(
    qs: QuerySet[Task], *, sort: str = "created", cursor: str | None = None, size: int = 100
) -> tuple[list[Task], str | None]:
    """One keyset page of ``qs`` in ``sort`` order (``-name``: descending), ties by id, and the
    cursor of the next page (None at the end). Never OFFSET: each page is one range scan."""
    desc = sort.startswith("-")
    name = sort[1:] if desc else sort
    if name not in SORTS:
        raise InvalidInput(f"sort must be one of {sorted(SORTS)} (prefix '-' for descending)", field="sort")
    column, null = SORTS[name]
    key = Coalesce(F(column), Value(null)) if null is not None else F(column)
    qs = qs.annotate(_key=key)
    if cursor:
        value, last_id = _cursor_decode(cursor)
        after = (
            Q(_key__lt=value) | Q(_key=value, id__lt=last_id)
            if desc
            else Q(_key__gt=value) | Q(_key=value, id__gt=last_id)
        )
        qs = qs.filter(after)
    order = ("-_key", "-id") if desc else ("_key", "id")
    rows = list(qs.order_by(*order)[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return rows, (_cursor_encode(rows[-1]._key, rows[-1].id) if more and rows else None)  # type: ignore[attr-defined]


def _cursor_encode(value: Any, last_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([value, last_id]).encode()).decode().rstrip("=")


def _cursor_decode(cursor: str) -> tuple[Any, int]:
    try:
        value, last_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if not isinstance(last_id, int) or isinstance(value, (list, dict)):
            raise ValueError
        return value, last_id
    except (ValueError, TypeError, UnicodeDecodeError):
        raise InvalidInput("invalid cursor", field="cursor") from None


# --- rendering -------------------------------------------------------------------------------------
def task_stats_render(t: Task) -> dict[str, Any]:
    mean = variance = None
    if t.rewarded:
        mean = t.reward_sum / t.rewarded
        variance = max(0.0, t.reward_sumsq / t.rewarded - mean * mean)
    return {
        "seen": t.seen,
        "attempted": t.attempted,
        "completed": t.completed,
        "failed": t.failed,
        "rewarded": t.rewarded,
        "passes": t.passes,
        "pass_rate": t.pass_rate,
        "mean_reward": mean,
        "reward_variance": variance,
        "informative_groups": t.informative_groups,
        "last_policy_version": t.last_policy_version,
        "recent": {
            "rewarded": t.recent_rewarded,
            "passes": t.recent_passes,
            "pass_rate": t.recent_pass_rate,
            "score": t.score,
        },
    }


def task_render(t: Task) -> dict[str, Any]:
    return {
        "uid": t.uid,
        "set": t.set_name,
        "prompt": t.prompt,
        "ground_truth": t.ground_truth,
        "metadata": t.metadata,
        "created_at": t.created_at,
        "last_seen_at": t.last_seen_at,
        "stats": task_stats_render(t),
    }


def tasks_histogram(qs: QuerySet[Task]) -> dict[str, int]:
    """Counts per bucket (unseen, solved, hopeless, informative) and in all: one query."""
    agg = qs.aggregate(
        total=Count("id"),
        **{b: Count("id", filter=bucket_q(b)) for b in ("unseen", "solved", "hopeless", "informative")},
    )
    return {k: int(v) for k, v in agg.items()}


BINS = 10  # the pass-rate histogram: [0, 0.1), [0.1, 0.2), ... [0.9, 1.0]


def tasks_overview(*, set_name: str | None = None, sources: Sources = None, rows: int = 50) -> dict[str, Any]:
    """The tasks page: bucket counts (the same Q objects as ``GET /api/v1/tasks?bucket=``),
    the pass-rate histogram of seen tasks, the sets, and the most informative tasks."""
    qs = tasks_listed(sources)
    if set_name:
        qs = qs.filter(set_name=set_name)
    edges = [i / BINS for i in range(BINS + 1)]
    bins = {
        f"b{i}": Count(
            "id",
            filter=Q(pass_rate__gte=edges[i])
            & (Q(pass_rate__lt=edges[i + 1]) if i < BINS - 1 else Q(pass_rate__lte=1.0)),
        )
        for i in range(BINS)
    }
    agg = qs.aggregate(**bins)
    counts = [int(agg[f"b{i}"]) for i in range(BINS)]
    top = max(counts) or 1
    shown = list(qs.filter(seen__gt=0).order_by("-score", "rand_key")[:rows])
    for t in shown:
        t.mean_reward = t.reward_sum / t.rewarded if t.rewarded else None  # type: ignore[attr-defined]
        t.bucket = task_bucket(t.pass_rate)  # type: ignore[attr-defined]
    return {
        "buckets": tasks_histogram(qs),
        "bins": [
            {"lo": edges[i], "hi": edges[i + 1], "count": c, "pct": round(100 * c / top)}
            for i, c in enumerate(counts)
        ],
        "sets": sorted(set(tasks_listed(sources).values_list("set_name", flat=True).distinct())),
        "rows": shown,
        "set": set_name or "",
    }
