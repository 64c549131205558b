"""Celery tasks of the pool. Thin and idempotent: ids in, one service call.

Enqueued with transaction.on_commit by the services that make them necessary.
"""

from __future__ import annotations

import logging

from celery import shared_task

log = logging.getLogger(__name__)


@shared_task(name="pool.group_merge")
def group_merge(group_id: int) -> None:
    """Compute (or refresh) the prefix-tree merge of a complete prompt group. Idempotent: an
    unchanged input is skipped; a vanished group is ignored."""
    from .services.merge import group_merge_compute

    group_merge_compute(group_id=group_id)
