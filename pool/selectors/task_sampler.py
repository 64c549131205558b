"""The task sampler: which tasks to roll out next (POST /api/v1/task-sampler).

Every strategy reads a bounded number of rows through an index of pool.models.Task (the
set's score, seen count, recent pass rate or random key), never the whole set, so its cost
does not grow with the number of registered tasks:

* ``uniform``: ``SEGMENTS`` random points on the tasks' random keys (``rand_key``, fixed at
  registration), the tasks after each; every task is equally likely in expectation;
* ``least_seen``: the least-seen tasks (counted groups), ties broken at random;
* ``informative``: the highest informative score p(1 - p) of the recent pass rate, smoothed
  by a Beta(1, 1) prior (an unseen task scores 0.25, the maximum, so every task gets a first
  look), drawn from the top ``CANDIDATES x n`` with weights exp(score / temperature)
  (temperature 0: the top n);
* ``easy_to_hard``: the tasks whose recent pass rate is nearest ``target`` (default 0.7:
  solved often enough to learn from, failed often enough to teach). The recent pass rate is
  per the policy versions of the window (pool/services/task_stats.py), so as the policy
  improves the tasks at the target are harder ones: the band moves with the policy.

``informative`` and ``easy_to_hard`` explore: ``explore_fraction`` of the n slots (at least
one when any task qualifies) go to tasks seen fewer than ``explore_below`` times, least seen
first, so a task that looked solved or hopeless after one group is looked at again and
nothing is starved. Within one answer a task appears once. Seeded: the same seed over the
same statistics gives the same answer.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from ..models import Task

STRATEGIES = ("uniform", "least_seen", "informative", "easy_to_hard")
SEGMENTS = 8  # uniform: random points per answer (one indexed range scan each)
CANDIDATES = 4  # informative / least_seen / easy_to_hard read the top CANDIDATES x n rows
DEFAULTS: dict[str, Any] = {
    "explore_below": 4,
    "explore_fraction": 0.0625,
    "temperature": 0.02,
    "target": 0.7,
}


@dataclass(slots=True)
class Pick:
    task: Task
    reason: str


def tasks_pick(
    qs: QuerySet[Task],
    *,
    n: int,
    strategy: str,
    seed: int,
    explore_below: int = DEFAULTS["explore_below"],
    explore_fraction: float = DEFAULTS["explore_fraction"],
    temperature: float = DEFAULTS["temperature"],
    target: float = DEFAULTS["target"],
) -> list[Pick]:
    """Up to ``n`` distinct tasks of ``qs`` by ``strategy`` (module docstring), each with the
    reason it was picked. Reads only; the service records the answer."""
    rng = random.Random(seed)
    picks: list[Pick] = []
    if strategy == "uniform":
        return _uniform(qs, n, rng)
    if strategy == "least_seen":
        return _least_seen(qs, n, rng)
    if explore_fraction > 0 and explore_below > 0:
        slots = max(1, round(n * explore_fraction))
        for t in _least_seen(qs.filter(seen__lt=explore_below), slots, rng):
            picks.append(Pick(t.task, f"explore: seen {t.task.seen} < {explore_below}"))
    rest = qs.exclude(id__in=[p.task.id for p in picks])
    want = n - len(picks)
    if strategy == "informative":
        picks += _informative(rest, want, rng, temperature)
    else:
        picks += _easy_to_hard(rest, want, rng, target)
    return picks


def _uniform(qs: QuerySet[Task], n: int, rng: random.Random) -> list[Pick]:
    """``SEGMENTS`` random points on rand_key, about n / SEGMENTS tasks after each (wrapping
    round); more points while short, until the set is exhausted."""
    got: dict[int, Task] = {}
    per = max(1, math.ceil(n / SEGMENTS))
    for _round in range(4):
        for _ in range(SEGMENTS):
            if len(got) >= n:
                break
            r = rng.random()
            take = min(per, n - len(got))
            rows = list(qs.filter(rand_key__gte=r).exclude(id__in=list(got)).order_by("rand_key")[:take])
            if len(rows) < take:
                rows += list(
                    qs.exclude(id__in=list(got) + [t.id for t in rows]).order_by("rand_key")[
                        : take - len(rows)
                    ]
                )
            for t in rows:
                got.setdefault(t.id, t)
        if len(got) >= n or not qs.exclude(id__in=list(got)).exists():
            break
    return [Pick(t, "uniform") for t in got.values()][:n]


def _least_seen(qs: QuerySet[Task], n: int, rng: random.Random) -> list[Pick]:
    """The n least-seen tasks; among those tied at the boundary count, a random choice."""
    if n <= 0:
        return []
    rows = list(qs.order_by("seen", "rand_key")[: CANDIDATES * n])
    if len(rows) <= n:
        return [Pick(t, f"least_seen: seen {t.seen}") for t in rows]
    boundary = rows[n - 1].seen
    sure = [t for t in rows if t.seen < boundary]
    tied = [t for t in rows if t.seen == boundary]
    rng.shuffle(tied)
    chosen = sure + tied[: n - len(sure)]
    return [Pick(t, f"least_seen: seen {t.seen}") for t in chosen]


def _informative(qs: QuerySet[Task], n: int, rng: random.Random, temperature: float) -> list[Pick]:
    if n <= 0:
        return []
    rows = list(qs.order_by("-score", "rand_key")[: CANDIDATES * n])
    if temperature > 0 and len(rows) > n:
        top = rows[0].score
        # Efraimidis-Spirakis: the n largest u ** (1 / w) are a weighted draw without replacement.
        keyed = sorted(
            rows,
            key=lambda t: math.log(rng.random() or 1e-300) / math.exp((t.score - top) / temperature),
            reverse=True,
        )
        rows = sorted(keyed[:n], key=lambda t: (-t.score, t.rand_key))
    return [
        Pick(t, f"informative: score {t.score:.3f} (recent pass rate {t.recent_pass_rate:.2f})")
        for t in rows[:n]
    ]


def _easy_to_hard(qs: QuerySet[Task], n: int, rng: random.Random, target: float) -> list[Pick]:
    if n <= 0:
        return []
    above = list(qs.filter(recent_pass_rate__gte=target).order_by("recent_pass_rate")[: CANDIDATES * n])
    below = list(qs.filter(recent_pass_rate__lt=target).order_by("-recent_pass_rate")[: CANDIDATES * n])
    rows = sorted(above + below, key=lambda t: (abs(t.recent_pass_rate - target), rng.random()))[:n]
    return [
        Pick(t, f"easy_to_hard: recent pass rate {t.recent_pass_rate:.2f}, target {target:.2f}") for t in rows
    ]
