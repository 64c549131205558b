"""Reads behind /readyz and /metrics: the dependencies' health, and the pool's state as
Prometheus metric families (read at scrape time, so every process agrees; see
claw_kit/metrics.py).

Cost per scrape: a handful of aggregate queries (GROUP BY over steps by source and token
source is the largest: a sequential scan of steps; scrape every 30-60 s, not every second).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.conf import settings
from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, F, FloatField, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from claw_kit.redis_conn import redis_client
from curation.models import Lease, Snapshot
from pool.models import MergeResult, Step, Trajectory


def dependencies_check() -> dict[str, str]:
    """{"database": "ok"|"error: ...", "redis": "ok"|"not configured"|"error: ..."}: one
    round trip to each. Never raises."""
    result = {"database": "ok", "redis": "not configured"}
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure means not ready
        result["database"] = f"error: {type(exc).__name__}"
    client = redis_client()
    if client is not None:
        try:
            client.ping()
            result["redis"] = "ok"
        except Exception as exc:  # noqa: BLE001
            result["redis"] = f"error: {type(exc).__name__}"
    return result


def pool_metric_families() -> Iterator[Metric]:
    """The pool's state as metric families (see the module docstring for the cost)."""
    steps = GaugeMetricFamily(
        "claw_steps", "Steps in the pool by source and token source.", labels=["source", "token_source"]
    )
    total = 0
    for source, token_source, n in (
        Step.objects.values_list("source__name", "token_source").annotate(n=Count("id")).order_by()
    ):
        steps.add_metric([source or "", token_source or ""], n)
        total += n
    yield steps
    drift = Step.objects.filter(drift=True).count()
    yield GaugeMetricFamily("claw_steps_drift", "Steps whose prompt did not extend the previous step.", drift)
    yield GaugeMetricFamily(
        "claw_drift_rate", "Share of steps with retokenisation drift.", drift / total if total else 0.0
    )
    yield _by_status("claw_trajectories", "Trajectories by status.", Trajectory.objects)
    yield _by_status("claw_leases", "Consumer leases by status.", Lease.objects)
    yield _queue_depth()
    snapshots = Snapshot.objects.filter(status=Snapshot.Status.DONE).aggregate(
        n=Count("id"),
        total=Sum(ExpressionWrapper(F("updated_at") - F("created_at"), output_field=DurationField())),
    )
    yield SummaryMetricFamily(
        "claw_snapshot_build_seconds",
        "Done snapshots: time from request to done (queue wait included).",
        count_value=snapshots["n"],
        sum_value=snapshots["total"].total_seconds() if snapshots["total"] else 0.0,
    )
    merges = MergeResult.objects.filter(status=MergeResult.Status.DONE).aggregate(
        n=Count("id", filter=Q(stats__has_key="build_ms")),
        total=Sum(Cast(KT("stats__build_ms"), FloatField())),
    )
    yield SummaryMetricFamily(
        "claw_merge_build_seconds",
        "Done prefix-tree merges: time to build the tree (MergeResult.stats.build_ms).",
        count_value=merges["n"],
        sum_value=(merges["total"] or 0.0) / 1e3,
    )


def _by_status(name: str, doc: str, manager) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["status"])
    for status, n in manager.values_list("status").annotate(n=Count("pk")).order_by():
        family.add_metric([status], n)
    return family


def _queue_depth() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "claw_celery_queue_length", "Tasks waiting in the Celery queue (Redis broker only).", labels=["queue"]
    )
    client = redis_client()
    if client is not None:
        queue = settings.CELERY_TASK_DEFAULT_QUEUE
        try:
            family.add_metric([queue], client.llen(queue))
        except Exception:  # noqa: BLE001 - a scrape reports what it can; /readyz names the failure
            pass
    return family
