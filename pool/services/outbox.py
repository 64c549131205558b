"""The task outbox: follow-up work of committed writes survives a broker outage.

``pool.tasks.enqueue_on_commit`` stores an ``OutboxTask`` row in the caller's transaction
(so the work is durable exactly when the write is), publishes it after the commit and
deletes the row. When publishing fails (Redis down) the row stays and this module sends it
later: the failing process starts a background relay (``relay_soon``) that retries with
backoff until the outbox is empty, and the periodic task ``pool.outbox_relay`` (celery beat)
sends rows that a process which died left behind. A request never waits for the broker.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from ..models import OutboxTask

log = logging.getLogger(__name__)

# A row younger than this may still be published by its own on-commit callback: the relay
# leaves it alone, so a task is normally sent once (twice is harmless: tasks are idempotent).
GRACE = timedelta(seconds=5)
RELAY_BATCH = 500

_relay_lock = threading.Lock()
_relay_thread: threading.Thread | None = None


def publish(name: str, args: list, row_id: int | None) -> bool:
    """Send one task to the broker now; on success delete its outbox row. False when the
    broker refused it (the row stays for the relay)."""
    return publish_many([(name, args, row_id)])


def publish_many(tasks: list[tuple[str, list, int | None]]) -> bool:
    """Send (task name, args, outbox row id) in order over one broker connection, then
    delete the rows of those sent in one statement. False when one was refused (its row
    stays for the relay); the broker being down, the rest are not tried (they would fail
    too). In eager mode (no broker: the task runs here) a failing task does not hold back
    the others."""
    sent: list[int] = []
    failed = False
    try:
        with current_app.producer_or_acquire() as producer:
            for name, args, row_id in tasks:
                try:
                    _send(name, args, producer=producer)
                except Exception:  # noqa: BLE001 - any broker failure; the row keeps the task
                    log.warning(
                        "broker unavailable: %s%r stays in the outbox", name, tuple(args), exc_info=True
                    )
                    failed = True
                    if not current_app.conf.task_always_eager:
                        break
                    continue
                if row_id is not None:
                    sent.append(row_id)
    except Exception:  # noqa: BLE001 - no connection to the broker at all
        log.warning(
            "broker unavailable: %d task(s) stay in the outbox", len(tasks) - len(sent), exc_info=True
        )
        failed = True
    if sent:
        OutboxTask.objects.filter(id__in=sent).delete()
    return not failed


def _send(name: str, args: list, **options: object) -> None:
    """Publish through the registered task (apply_async honours eager mode, where the task
    runs in-process), without inline retries."""
    current_app.tasks[name].apply_async(args=args, retry=False, **options)


def outbox_relay(*, limit: int = RELAY_BATCH, grace: timedelta = GRACE) -> dict[str, int]:
    """Send pending outbox tasks older than ``grace``, oldest first, and delete those the
    broker took. Stops at the first refusal (the broker is down: the rest would fail too).
    Concurrent relays skip each other's rows on PostgreSQL. Idempotent."""
    sent = failed = 0
    with transaction.atomic():
        rows = (
            OutboxTask.objects.filter(created_at__lte=timezone.now() - grace)
            .order_by("created_at", "id")
            .select_for_update(skip_locked=connection.vendor == "postgresql")[:limit]
        )
        done: list[int] = []
        for row in rows:
            try:
                _send(row.name, row.args)
            except Exception:  # noqa: BLE001
                failed = 1
                OutboxTask.objects.filter(id=row.id).update(attempts=row.attempts + 1)
                break
            done.append(row.id)
            sent += 1
        OutboxTask.objects.filter(id__in=done).delete()
    pending = OutboxTask.objects.count() if failed else 0
    if failed:
        log.warning("outbox: broker unavailable, %d task(s) pending", pending)
    elif sent:
        log.info("outbox: sent %d task(s)", sent)
    return {"sent": sent, "failed": failed, "pending": pending}


def relay_soon() -> None:
    """Start this process's background relay if it is not running: it retries the outbox
    with backoff (CLAW_OUTBOX_RETRY_SECONDS, doubling to 8x) until the outbox is empty."""
    global _relay_thread
    with _relay_lock:
        if _relay_thread is not None and _relay_thread.is_alive():
            return
        _relay_thread = threading.Thread(target=_relay_until_empty, name="claw-outbox-relay", daemon=True)
        _relay_thread.start()


def _relay_until_empty() -> None:
    base = float(getattr(settings, "CLAW_OUTBOX_RETRY_SECONDS", 2.0))
    delay = base
    stop = threading.Event()  # never set: an interruptible wait (no busy loop)
    try:
        while True:
            stop.wait(delay)
            try:
                result = outbox_relay()
            except Exception:  # noqa: BLE001 - the database may be down too; keep trying
                log.exception("outbox relay failed")
                result = {"failed": 1, "pending": 1}
            if not result["failed"] and not OutboxTask.objects.exists():
                return
            delay = base if not result["failed"] else min(delay * 2, base * 8)
    finally:
        close_old_connections()
        connection.close()
