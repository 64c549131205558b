"""Prometheus metrics: the per-process proxy latency histogram and the /metrics exposition.

Two kinds of metric, chosen so that every scrape tells the truth whichever process answers:

- **Pool state** (steps, trajectories, leases, queue depth, build durations) is read from the
  database and Redis at scrape time (``pool_metric_families`` in claw_site/observability.py,
  which /metrics, claw_site/ops.py, hands to ``exposition`` here), so every process reports
  the same numbers and nothing is lost when a process restarts.
- **Proxy latency** is only known inside the process that served the call. With
  PROMETHEUS_MULTIPROC_DIR set (required with more than one worker: `serve` prepares the
  folder), prometheus_client's multiprocess mode writes each process's samples to files there
  and a scrape sums them all; without it, each process exposes its own histogram.

prometheus_client chooses its storage when it is first imported, from the environment; the
variable must therefore be set before the process starts (the Procfile does).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Buckets for a proxied LLM call: milliseconds (cached, errors) up to minutes (long generations).
PROXY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
PROXY_LATENCY = Histogram(
    "claw_proxy_request_duration_seconds",
    "OpenAI-compatible gateway calls: time from request to last response byte.",
    ["route", "status"],
    buckets=PROXY_BUCKETS,
)
_STATUS_CLASS = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


def observe_proxy(route: str, status: int, seconds: float) -> None:
    PROXY_LATENCY.labels(route, _STATUS_CLASS.get(status // 100, "other")).observe(seconds)


def multiprocess_dir() -> str:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR", "") or os.environ.get("prometheus_multiproc_dir", "")


def exposition(collector: Collector) -> bytes:
    """The text exposition: ``collector``'s families (the pool's, read now) followed by the
    process metrics (all processes' in multiprocess mode, else this one's default registry)."""
    pool = CollectorRegistry(auto_describe=False)
    pool.register(collector)
    if multiprocess_dir():
        from prometheus_client import multiprocess

        processes = CollectorRegistry()
        multiprocess.MultiProcessCollector(processes)
        return generate_latest(pool) + generate_latest(processes)
    from prometheus_client import REGISTRY

    return generate_latest(pool) + generate_latest(REGISTRY)


class FamiliesCollector(Collector):
    """A collector over families computed by the caller (once per scrape)."""

    def __init__(self, families: Iterable[Metric]):
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return iter(self.families)
