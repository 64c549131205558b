"""Upkeep of the pool's counters (pool.models.Counter, pool/selectors/counters.py).

The triggers append a row per counter each write statement changed, so the table grows with
the writes; ``counters_compact`` folds each counter's rows into one (per source), the read
then sums a few hundred rows. Run by celery beat (``counters-compact``) and safe at any time,
concurrently with writes and with itself: the DELETE removes only the rows its snapshot
sees, the INSERT puts back their sum in the same transaction, so a count never changes by a
compaction, and the rows of writes that commit meanwhile stay as they are for the next one.
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

from .. import sql
from ..selectors.counters import minute_of

# Keeps two compactions from doing the same work twice (a second one would find nothing).
_LOCK = 0x636C6177_0C01
# Minutes of per-minute counters kept (the overview reads the last hour); older ones go.
MINUTES_KEPT = 180


def counters_compact() -> dict[str, int]:
    """Fold the counters' rows into one per counter and key (zero counts dropped), and drop
    the per-minute counters older than MINUTES_KEPT. Idempotent. Returns the rows before and
    after; nothing on a database without counters."""
    if connection.vendor != "postgresql":
        return {"rows_before": 0, "rows_after": 0}
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK])
        if not cur.fetchone()[0]:
            return {"rows_before": 0, "rows_after": 0}
        before, after = sql.counters_fold(minute_of(timezone.now()) - MINUTES_KEPT)
    return {"rows_before": before, "rows_after": after}
