"""Real traffic for the overview's counters, and the same numbers as the API tells them.

``drive`` writes through the HTTP API (white-box steps, trajectory completion with a reward,
a policy version, a pull) and the pool's own services where no door sets the field (a
retokenized step with drift, an operator label, a group's merge). ``api_numbers`` reads every
overview counter back from the API (``GET /api/v1/stats`` and the step list) or, where the
API has no count (ready groups, merges, leases), from the database.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from django.db.models import Sum
from django.utils import timezone

from curation.models import Consumer, Lease
from curation.selectors.live import RATES_WINDOW
from curation.services.datasets import dataset_create
from curation.services.labels import steps_label
from pool.ingest.contract import StepIn
from pool.ingest.pipeline import steps_ingest
from pool.models import Event, MergeResult, PromptGroup, Step
from pool.services.merge import group_merge_compute
from tests.conftest import make_step, post_steps

# What drive() leaves behind, counted by hand (the test also compares with the API).
EXPECTED = {
    "collect.steps": 8,  # g-r0: 2, g-r1: 1, run: 2, unrewarded: 1, retok: 1, tail: 1
    "collect.trajectories": 6,
    "collect.running": 2,  # run and tail
    "represent.exact": 7,
    "represent.retokenized": 1,
    "represent.drift": 1,
    "curate.ready_steps": 3,  # the two rollouts of the ready group
    "curate.awaiting_reward": 4,  # run: 2, unrewarded: 1, tail: 1
    "curate.ready_groups": 1,
    "curate.labelled": 1,
    "consume.leases_open": 1,
    "consume.acked": 0,
    "consume.consumers": 1,
    "optimize.merged_groups": 1,
    "quality.steps": 8,  # all of them in the last hour
    "quality.drift_pct": 12,  # 1 of 8
    "quality.errors": 0,
    "policy_version": 3,
}


def drive(agent, trainer, *, prefix: str = "") -> None:
    """Every kind of counter moved at least once: a two-rollout group completed with rewards
    through the API (ready), a running trajectory, a completed one without a reward, a
    retokenized step with drift (the pool's service: only the gateway sets those), a
    labelled step, a merge of the group, a policy version and a pull."""
    p = prefix
    assert agent.post(
        "/api/v1/groups", {"uid": f"{p}g", "expected_rollouts": 2}, format="json"
    ).status_code in (
        200,
        201,
    )
    steps = [
        make_step(f"{p}g-r0", 0, group=f"{p}g", prompt=[1, 2, 3], response=[4, 5]),
        make_step(f"{p}g-r0", 1, group=f"{p}g", prompt=[1, 2, 3, 4, 5, 6], response=[7]),
        make_step(f"{p}g-r1", 0, group=f"{p}g", prompt=[1, 2, 3], response=[8, 9]),
        make_step(f"{p}run", 0, group=None),
        make_step(f"{p}run", 1, group=None),
        make_step(f"{p}unrewarded", 0, group=None, is_last=True),
        make_step(f"{p}tail", 0, group=None),
    ]
    assert post_steps(agent, steps).status_code == 201
    for uid, reward in ((f"{p}g-r0", 1.0), (f"{p}g-r1", 0.0)):
        resp = agent.post(f"/api/v1/trajectories/{uid}/complete", {"reward": reward}, format="json")
        assert resp.status_code == 200, resp.content
    ids = lambda *v: np.array(v, dtype=np.int32)  # noqa: E731
    steps_ingest(
        steps=[
            StepIn(
                trajectory_uid=f"{p}retok",
                step_index=0,
                prompt_ids=ids(1, 2),
                response_ids=ids(3),
                token_source=Step.TokenSource.RETOKENIZED,
                drift=True,
                drift_offset=1,
                reward=0.5,
                is_last=True,
            )
        ]
    )
    steps_label(step_ids=[Step.objects.get(uid=f"{p}run-s0").id], actor="op", label=Step.Label.ACCEPTED)
    group_merge_compute(group_id=PromptGroup.objects.get(uid=f"{p}g").id)
    resp = trainer.post("/api/v1/policy-versions", {"version": 3, "current": True}, format="json")
    assert resp.status_code in (200, 201), resp.content
    dataset_create(name=f"{p}all", spec={"filters": {"readiness": "any"}}, actor="op")
    resp = trainer.post(
        f"/api/v1/consumers/{p}c1/pull", {"dataset": f"{p}all", "batch_size": 1}, format="json"
    )
    assert resp.status_code == 200 and resp.json()["lease_id"], resp.content


def api_numbers(reader) -> dict[str, Any]:
    """Every overview counter as the API says it (the database where the API has no count)."""
    stats = reader.get("/api/v1/stats").json()
    steps: list[dict] = []
    url = "/api/v1/steps?page_size=1000"
    while url:
        page = reader.get(url).json()
        steps += page["results"]
        url = page["next"]
    since = timezone.now() - RATES_WINDOW
    recent = Step.objects.filter(created_at__gte=since)
    recent_steps, recent_drift = recent.count(), recent.filter(drift=True).count()
    errors = Event.objects.filter(type__in=("upstream_error", "record_failed"), created_at__gte=since).count()
    merged = MergeResult.objects.filter(status=MergeResult.Status.DONE, group__isnull=False)
    tokens = merged.aggregate(t=Sum("total_tokens"), u=Sum("unique_tokens"))
    return {
        **api_counters(stats, steps),
        "curate.ready_groups": PromptGroup.objects.filter(ready_at__isnull=False).count(),
        "optimize.merged_groups": merged.count(),
        "optimize.tokens": tokens["t"] or 0,
        "optimize.tokens_saved": (tokens["t"] or 0) - (tokens["u"] or 0),
        "consume.leases_open": Lease.objects.filter(status=Lease.Status.LEASED).count(),
        "consume.acked": Lease.objects.filter(status=Lease.Status.ACKED).count(),
        "consume.consumers": Consumer.objects.count(),
        "quality.steps": recent_steps,
        "quality.drift_pct": round(100 * recent_drift / recent_steps) if recent_steps else None,
        "quality.errors": errors,
        "quality.error_pct": round(100 * errors / (recent_steps + errors)) if recent_steps + errors else None,
        "policy_version": stats["current_policy_version"],
    }


def state_numbers(state: dict[str, Any]) -> dict[str, Any]:
    """A state (hello, page context) flattened to the ``api_numbers`` keys."""
    out = {
        f"{section}.{name}": value
        for section, values in state.items()
        if isinstance(values, dict)
        for name, value in values.items()
        if name not in ("sources", "saved_pct", "window_hours")
    }
    return out | {"policy_version": state["policy_version"]}


def page_numbers(html: str) -> dict[str, Any]:
    """Every ``data-live`` number of a served page, by its path."""
    found = dict(re.findall(r'data-live="([a-z_.]+)"[^>]*>([^<]*)<', html))
    # Numbers are shown with thousands separators (12,345): read back as ints.
    return {k: None if v == "–" else int(v.removesuffix("%").replace(",", "")) for k, v in found.items()}


def consistent(n: dict[str, Any]) -> None:
    """The counters agree with each other, whatever the traffic."""
    assert n["represent.exact"] + n["represent.retokenized"] <= n["collect.steps"], n
    assert n["represent.drift"] <= n["collect.steps"], n
    assert n["curate.ready_steps"] + n["curate.awaiting_reward"] <= n["collect.steps"], n
    assert n["curate.ready_steps"] <= n["represent.exact"], n
    assert n["collect.running"] <= n["collect.trajectories"], n
    assert n["quality.steps"] <= n["collect.steps"], n


def api_counters(stats: dict, steps: list[dict]) -> dict[str, int]:
    """The overview counters the API itself states: its /stats and its step reads (the
    whole step list), the same for a test client and a browser test's HTTP client."""
    # the API's two views of "awaiting reward" agree: its stats and its step reads
    assert stats["steps_reward_pending"] == sum("reward_final" not in s["readiness"] for s in steps)
    return {
        "collect.steps": stats["steps"],
        "collect.trajectories": stats["trajectories"],
        "collect.running": stats["trajectories_by_status"].get("running", 0),
        "represent.exact": sum(s["token_source"] in ("client", "upstream") for s in steps),
        "represent.retokenized": sum(s["token_source"] == "retokenized" for s in steps),
        "represent.drift": stats["steps_drift"],
        "curate.ready_steps": sum(s["ready"] for s in steps),
        "curate.awaiting_reward": stats["steps_reward_pending"],
        "curate.labelled": sum(s["label"] is not None for s in steps),
    }
