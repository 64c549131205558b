"""Reads of the dashboard pages, one per lifecycle stage (collect, represent, curate,
optimize, consume). Each function is a bounded number of queries, whatever the pool's size:
aggregates, or pages of at most a few dozen rows (keyset on id, never OFFSET).

The numbers a page starts with are the ones the live websocket's hello state carries
(curation/selectors_live.py): the page is correct without live updates, and live events
only move it forward.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, F, Max, Q, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from pool.flags import READINESS_NAMES
from pool.flags import names as flag_names
from pool.models import MergeResult, PolicyVersion, PromptGroup, Source, Step, Trajectory
from pool.selectors import pool_stats, steps_render

from .models import Consumer, Dataset, Lease, Snapshot
from .selectors import keyset_page, trajectory_timeline
from .selectors_live import live_state

# Minutes shown by the overview's ingestion-rate chart (one point per minute).
RATE_MINUTES = 30
# Rows per page of the step list; groups on the optimization page; snapshots and leases shown.
STEP_PAGE = 50
GROUP_PAGE = 50
SNAPSHOTS_SHOWN = 20
LEASES_SHOWN = 30
# Radix nodes drawn by the prefix-tree view (a group of n rollouts has at most 2n - 1).
TREE_NODES_SHOWN = 400
# The prefix-tree drawing: its width (SVG units) and the height of one leaf's row.
TREE_W, TREE_ROW = 1000, 22


# --- overview ---------------------------------------------------------------------------------
def overview() -> dict[str, Any]:
    """Everything the overview shows: the counters of the five stages and the last hour's
    quality (``state``: the live hello state, one consistent read, curation/selectors_live.py),
    the ingestion rate per minute, sources and their health, and token storage."""
    state = live_state(["overview"])
    quality = state["quality"]
    calls = quality["steps"] + quality["errors"]
    return {
        "stats": pool_stats(),
        "state": state,
        "rate": ingest_rate(),
        "sources": sources_health(),
        "error_rate": quality["errors"] / calls if calls else None,
    }


def ingest_rate(*, now: datetime | None = None, minutes: int = RATE_MINUTES) -> list[dict[str, Any]]:
    """Steps stored per minute over the last ``minutes`` minutes, oldest first, zeros
    included (one GROUP BY on the step_created index range)."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0)
    start = end - timedelta(minutes=minutes - 1)
    counts = {
        m.replace(second=0, microsecond=0): n
        for m, n in Step.objects.filter(created_at__gte=start)
        .annotate(m=TruncMinute("created_at"))
        .values_list("m")
        .annotate(n=Count("id"))
        .values_list("m", "n")
    }
    return [
        {"minute": start + timedelta(minutes=i), "steps": counts.get(start + timedelta(minutes=i), 0)}
        for i in range(minutes)
    ]


def sources_health() -> list[dict[str, Any]]:
    """Every source with its trajectory and step counts and when it was last seen (its newest
    trajectory's update). Sources are few (one per agent runtime or service)."""
    rows = Source.objects.annotate(
        n_trajectories=Count("trajectories"),
        n_steps=Sum("trajectories__step_count"),
        last_seen=Max("trajectories__updated_at"),
    ).order_by(F("last_seen").desc(nulls_last=True), "name")
    return [
        {
            "name": s.name,
            "kind": s.kind,
            "trajectories": s.n_trajectories,
            "steps": s.n_steps or 0,
            "last_seen": s.last_seen,
        }
        for s in rows
    ]


def policy_current() -> PolicyVersion | None:
    return PolicyVersion.objects.filter(is_current=True).first()


# --- collection -------------------------------------------------------------------------------
def source_names() -> list[str]:
    return list(Source.objects.order_by("name").values_list("name", flat=True))


# --- representation ---------------------------------------------------------------------------
def steps_browse(
    *,
    source: str = "",
    token_source: str = "",
    drift: bool = False,
    before: int | None = None,
    limit: int = STEP_PAGE,
) -> tuple[list[Step], int | None]:
    """One page of steps, newest first, with the ``before`` cursor of the next page (None on
    the last). One query; token bytes and text stay in the database."""
    qs = (
        Step.objects.select_related("trajectory__source")
        .only(
            "id",
            "uid",
            "step_index",
            "prompt_len",
            "seq_len",
            "token_source",
            "drift",
            "drift_offset",
            "effective_reward",
            "reward_scope",
            "readiness",
            "created_at",
            "trajectory__uid",
            "trajectory__source__name",
        )
        .order_by("-id")
    )
    if source:
        qs = qs.filter(trajectory__source__name=source)
    if token_source:
        qs = qs.filter(token_source=token_source)
    if drift:
        qs = qs.filter(drift=True)
    return keyset_page(qs, before=before, limit=limit)


@dataclass(slots=True)
class StepInspect:
    """One step for the inspector: the step's timeline view (text, flags, labels, rewards,
    feedback), where its text came from, and its neighbours in the trajectory."""

    view: Any  # curation.selectors.StepView
    trajectory: Trajectory
    prompt_text: str | None  # decoded by CLAW_TOKENIZER when no chat messages are stored
    response_text: str | None
    text_origin: str  # "stored", "decoded" or "unknown"
    readiness_missing: list[str]
    previous_id: int | None
    next_id: int | None


def step_inspect(step_id: int, *, decode: bool = True) -> StepInspect | None:
    """The step ``step_id`` for the inspector, or None. The text is what was stored; when
    none was and a local tokenizer is configured (CLAW_TOKENIZER), the exact token ids are
    decoded with it (marked "decoded": a rendering, not what the model saw as text)."""
    row = Step.objects.filter(id=step_id).values_list("trajectory_id", "step_index").first()
    if row is None:
        return None
    timeline = trajectory_timeline(trajectory_id=row[0])
    if timeline is None:  # deleted in between
        return None
    views = timeline["steps"]
    at = next(i for i, v in enumerate(views) if v.step.id == step_id)
    v = views[at]
    prompt_text, response_text, origin = None, v.response_text, "stored"
    if not v.messages and v.response_text is None:
        origin = "unknown"
        if decode:
            decoded = _decode(v.step)
            if decoded is not None:
                prompt_text, response_text, origin = decoded[0], decoded[1], "decoded"
    return StepInspect(
        view=v,
        trajectory=timeline["trajectory"],
        prompt_text=prompt_text,
        response_text=response_text,
        text_origin=origin,
        readiness_missing=[
            n for n in READINESS_NAMES if n not in flag_names(v.step.readiness, READINESS_NAMES)
        ],
        previous_id=views[at - 1].step.id if at > 0 else None,
        next_id=views[at + 1].step.id if at + 1 < len(views) else None,
    )


def _decode(step: Step) -> tuple[str, str] | None:
    from gateway.proxy.tokenizer import get_tokenizer

    tok = get_tokenizer()
    if tok is None:
        return None
    step = Step.objects.select_related("trajectory__group").get(id=step.id)
    r = steps_render([step])[0]
    return tok.decode(r["prompt_ids"].tolist()), tok.decode(r["response_ids"].tolist())


# --- optimization -----------------------------------------------------------------------------
def optimization_overview(*, before: int | None = None, limit: int = GROUP_PAGE) -> dict[str, Any]:
    """Prompt groups newest first, each with its stored group merge (if any), and the
    savings over every merged group. Two queries."""
    qs = PromptGroup.objects.annotate(rollouts=Count("trajectories")).order_by("-id")
    groups, next_before = keyset_page(qs, before=before, limit=limit)
    merges = {
        m.group_id: m for m in MergeResult.objects.filter(group_id__in=[g.id for g in groups]).defer("layout")
    }
    totals = MergeResult.objects.filter(status=MergeResult.Status.DONE, group__isnull=False).aggregate(
        groups=Count("id"), total=Sum("total_tokens"), unique=Sum("unique_tokens")
    )
    total, unique = totals["total"] or 0, totals["unique"] or 0
    rows = []
    for g in groups:
        m = merges.get(g.id)
        row: dict[str, Any] = {
            "group": g,
            "merge": m,
            "tokens": None,
            "unique": None,
            "saved": None,
            "savings": None,
        }
        if m is not None and m.status == MergeResult.Status.DONE:
            row |= {
                "tokens": m.total_tokens,
                "unique": m.unique_tokens,
                "saved": m.total_tokens - m.unique_tokens,
                "savings": m.savings,
            }
        rows.append(row)
    return {
        "rows": rows,
        "next_before": next_before,
        "merged_groups": totals["groups"],
        "tokens": total,
        "unique": unique,
        "saved": total - unique,
        "savings": (total - unique) / total if total else None,
    }


def prefix_tree_layout(body: dict[str, Any], *, max_nodes: int = TREE_NODES_SHOWN) -> dict[str, Any]:
    """An icicle layout of a rendered merge (pool.services.merge.merge_tree_render), for the
    group page: each radix node a box from its token offset (x, in tokens) over the rows of
    the leaves under it, scaled to a ``TREE_W`` x ``TREE_ROW``-per-leaf SVG; and the same
    nodes depth-first (``rows``, each with its depth) for the nested list, with the step ids
    of the step uids through each node (one query).

    At most ``max_nodes`` nodes are laid out, chosen breadth-first so the shared trunk is
    always shown; ``cut`` counts the others. Iterative: a deep chain (a long multi-step
    trajectory) costs no recursion.
    """
    nodes = body.get("nodes") or []
    children: dict[Any, list[dict[str, Any]]] = {}
    for n in nodes:
        children.setdefault(n["parent"], []).append(n)
    shown: set[Any] = set()
    queue = deque(children.get(None, []))
    while queue and len(shown) < max_nodes:
        n = queue.popleft()
        shown.add(n["id"])
        queue.extend(children.get(n["id"], []))
    kids = {k: [c for c in v if c["id"] in shown] for k, v in children.items()}
    # Depth-first order (children in input order), each node with its token offset and depth.
    order: list[tuple[dict[str, Any], int, int]] = []
    stack = [(n, 0, 0) for n in reversed(kids.get(None, []))]
    while stack:
        n, offset, depth = stack.pop()
        order.append((n, offset, depth))
        stack.extend((c, offset + n["length"], depth + 1) for c in reversed(kids.get(n["id"], [])))
    # Leaves take one row each, in depth-first order; a node spans the rows of its leaves.
    first: dict[Any, int] = {}
    last: dict[Any, int] = {}
    leaf = 0
    for n, _, _ in order:
        if not kids.get(n["id"]):
            first[n["id"]] = last[n["id"]] = leaf
            leaf += 1
    for n, _, _ in reversed(order):
        under = kids.get(n["id"])
        if under:
            first[n["id"]] = first[under[0]["id"]]
            last[n["id"]] = last[under[-1]["id"]]
    wide = max((off + n["length"] for n, off, _ in order), default=0) or 1
    ids = step_ids_by_uid([u for n, _, _ in order for u in n["steps"] if u is not None])
    boxes, rows = [], []
    for n, offset, depth in order:
        steps = [(u, ids.get(u)) for u in n["steps"] if u is not None]
        shared = len(steps) > 1
        boxes.append(
            {
                "id": n["id"],
                # Strings: SVG wants a "." decimal point whatever the page's locale.
                "x": f"{TREE_W * offset / wide:.2f}",
                "y": first[n["id"]] * TREE_ROW + 1,
                "w": f"{max(TREE_W * n['length'] / wide, 1.0):.2f}",
                "h": (last[n["id"]] - first[n["id"]] + 1) * TREE_ROW - 2,
                "offset": offset,
                "length": n["length"],
                "steps": len(steps),
                "branches": len(children.get(n["id"], [])),
                "shared": shared,
            }
        )
        rows.append(
            {
                "node": n,
                "depth": depth,
                "indent": min(depth, 40),
                "offset": offset,
                "steps": steps,
                "shared": shared,
                "branches": len(children.get(n["id"], [])),
                "tokens": n["tokens"][:16],
                "more_tokens": n["truncated"] or len(n["tokens"]) > 16,
            }
        )
    return {
        "boxes": boxes,
        "rows": rows,
        "width": TREE_W,
        "height": max(leaf, 1) * TREE_ROW,
        "tokens_wide": wide,
        "cut": len(nodes) - len(shown),
    }


def step_ids_by_uid(uids: list[str]) -> dict[str, int]:
    """Step ids of these step uids (one query), to link tree nodes to the step inspector."""
    return dict(Step.objects.filter(uid__in=set(uids)).values_list("uid", "id"))


def group_get(uid: str) -> PromptGroup | None:
    return PromptGroup.objects.annotate(rollouts=Count("trajectories")).filter(uid=uid).first()


# --- consumption ------------------------------------------------------------------------------
def snapshots_recent(limit: int = SNAPSHOTS_SHOWN) -> list[Snapshot]:
    """The newest snapshots (snapshot_created index) with their dataset version."""
    return list(
        Snapshot.objects.select_related("dataset_version__dataset")
        .defer("step_ids", "masked_ids", "manifest")
        .order_by("-created_at")[:limit]
    )


def consumers_health() -> list[dict[str, Any]]:
    """Every consumer with its leases by status, the steps it acked and its lag (time since
    its last pull). Consumers are few (one per trainer); one query."""
    now = timezone.now()
    rows = Consumer.objects.annotate(
        n_open=Count("leases", filter=Q(leases__status=Lease.Status.LEASED)),
        n_acked=Count("leases", filter=Q(leases__status=Lease.Status.ACKED)),
        n_lost=Count("leases", filter=Q(leases__status__in=[Lease.Status.EXPIRED, Lease.Status.RELEASED])),
        steps_acked=Sum("leases__n_steps", filter=Q(leases__status=Lease.Status.ACKED)),
        last_pull=Max("leases__created_at"),
    ).order_by("name")
    return [
        {
            "name": c.name,
            "open": c.n_open,
            "acked": c.n_acked,
            "lost": c.n_lost,
            "steps_acked": c.steps_acked or 0,
            "last_pull": c.last_pull,
            "lag_seconds": (now - c.last_pull).total_seconds() if c.last_pull else None,
        }
        for c in rows
    ]


def leases_recent(limit: int = LEASES_SHOWN) -> list[Lease]:
    """The newest leases (lease_created index), without their bodies."""
    return list(
        Lease.objects.select_related("consumer", "dataset_version__dataset")
        .defer("body")
        .order_by("-created_at")[:limit]
    )


def lease_body(lease_id: uuid.UUID) -> bytes | None:
    """A lease's batch exactly as first served (the replay), or None."""
    body = Lease.objects.filter(id=lease_id).values_list("body", flat=True).first()
    return bytes(body) if body is not None else None


def datasets_with_current() -> list[Dataset]:
    return list(Dataset.objects.select_related("current").filter(current__isnull=False).order_by("name"))
