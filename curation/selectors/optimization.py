"""Reads of the optimization pages: prompt groups with their prefix-tree merges and the
savings over every merged group, and a merge laid out as an icicle for the group page."""

from __future__ import annotations

from collections import deque
from typing import Any

from django.db.models import Count, Sum

from pool.models import MergeResult, PromptGroup, Step

from .pages import keyset_page

# Groups per page of the optimization page.
GROUP_PAGE = 50
# Radix nodes drawn by the prefix-tree view (a group of n rollouts has at most 2n - 1).
TREE_NODES_SHOWN = 400
# The prefix-tree drawing: its width (SVG units) and the height of one leaf's row.
TREE_W, TREE_ROW = 1000, 22


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
    known = _steps_by_uid([u for n, _, _ in order for u in n["steps"] if u is not None])
    boxes, rows = [], []
    for n, offset, depth in order:
        steps = [known.get(u) or {"uid": u, "id": None} for u in n["steps"] if u is not None]
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
                "end": offset + n["length"] - 1,
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
                "end": offset + n["length"] - 1,
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


def _steps_by_uid(uids: list[str]) -> dict[str, dict[str, Any]]:
    """The steps among these uids, each as its uid, id, trajectory uid and index: what a span
    of the prefix tree names them by (one query); an unknown uid is absent."""
    rows = Step.objects.filter(uid__in=set(uids)).values_list("uid", "id", "trajectory__uid", "step_index")
    return {u: {"uid": u, "id": i, "trajectory": t, "index": x} for u, i, t, x in rows}


def group_get(uid: str) -> PromptGroup | None:
    return PromptGroup.objects.annotate(rollouts=Count("trajectories")).filter(uid=uid).first()
