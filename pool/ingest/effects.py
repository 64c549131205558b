"""The ingest's own effects of stored steps, registered on the bus (pool/bus.py) first of all
(pool/apps.py): the trajectories' counters and status, and the prompt groups' anchors."""

from __future__ import annotations

from .. import sql
from ..bus import StepsWritten
from ..models import PromptGroup


def trajectory_counters(written: StepsWritten) -> None:
    """Trajectory counters and status from the stored steps; nothing when the write's own
    statement already moved them (``counted``)."""
    if written.counted:
        return
    end: dict[int, int] = {}
    tail: dict[int, int] = {}
    last: set[int] = set()
    for s in written.steps:
        tid = s.trajectory_id
        end[tid] = max(end.get(tid, 0), s.step_index + 1)
        tail[tid] = max(tail.get(tid, 0), s.step_index)
        if s.is_last:
            last.add(tid)
    tail.update(written.tails)  # an append's tail is its first index, not its last
    sql.trajectories_after_write([(tid, n, tail[tid], tid in last) for tid, n in end.items()])


def group_anchors(written: StepsWritten) -> None:
    """The first step 0 of a group becomes its anchor: the parent candidate of the other
    rollouts' first steps, which share the group prompt. No statement for a group the write
    found anchored (a GRPO rollout's first step stored against the anchor)."""
    first: dict[int, int] = {}
    for s in written.steps:
        if s.step_index == 0:
            t = written.trajectories[s.trajectory_id]
            if t.group_id is not None and not t.anchored:
                first.setdefault(t.group_id, s.id)
    for gid, sid in first.items():
        PromptGroup.objects.filter(id=gid, anchor_step__isnull=True).update(anchor_step_id=sid)
