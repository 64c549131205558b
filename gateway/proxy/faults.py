"""A proxied call's failures, stored as Events and raised as ProxyErrors, and the recording
of its answer (whose failures are faults too). Shared by the runner and compat's /generate.

:func:`crash_point` is a fault injection hook for the tests of a process that dies at an
exact point of a call (tests/gateway/test_idempotency.py): with the environment
variable ``CLAW_TEST_CRASH_AT`` naming that point, the process SIGKILLs itself there. Unset
(always, outside those tests) it costs one comparison."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from claw_kit.llm import upstream
from claw_kit.web.errors import HttpError
from pool.errors import PoolError
from pool.services.api_keys import VerifiedKey
from pool.services.service_events import gateway_event_record

from . import owners
from .db import GroupWriter, run_db
from .recording import Identity, Outcome, RecordJob, groupable, record_answer, record_group

log = logging.getLogger(__name__)

# The proxied calls' writer: their steps committed together (db.GroupWriter).
_writer: GroupWriter[RecordJob, Outcome | None] = GroupWriter(record_group, name="claw-writer")

# The named points (see crash_point's callers).
KEPT = "idempotency.kept"  # the steps are committed, the Idempotency-Key's answer not yet kept
_CRASH_AT = os.environ.get("CLAW_TEST_CRASH_AT") or None


def crash_point(name: str) -> None:
    """SIGKILL this process when CLAW_TEST_CRASH_AT names ``name`` (module docstring)."""
    if _CRASH_AT is not None and _CRASH_AT == name:
        log.warning("CLAW_TEST_CRASH_AT=%s: killing the process", name)
        os.kill(os.getpid(), signal.SIGKILL)


async def record(
    endpoint: str,
    ident: Identity,
    key: VerifiedKey,
    body: dict[str, Any],
    answer: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Outcome:
    """Commit the call's steps; a database failure is answered 503 (the agent may retry),
    a Conflict (ended trajectory, other group) with its own status. A plain append is
    committed with the calls that wait beside it (the group writer, db.py); any other, or
    one the group could not take, alone on the pool."""
    try:
        outcome = None
        if settings.CLAW_PROXY_GROUP_COMMIT and groupable(endpoint, ident, body, answer):
            job = RecordJob(endpoint, ident, body, answer, key.source_id, key.write_sources, extra)
            outcome = await _writer.submit(job)
        if outcome is None:
            outcome = await run_db(
                record_answer,
                endpoint=endpoint,
                ident=ident,
                request=body,
                answer=answer,
                source_id=key.source_id,
                sources=key.write_sources,
                extra=extra,
            )
    except PoolError as e:
        await fault_event(
            e.status_code, "record_rejected", e.message, endpoint, ident, key, event_type="record_failed"
        )
        raise
    except DatabaseError as e:
        log.exception("recording a proxied call failed")
        await fault_event(
            503, "database_error", type(e).__name__, endpoint, ident, key, event_type="record_failed"
        )
        raise HttpError(
            503, "the call could not be recorded (database error); retry", code="record_failed"
        ) from None
    if outcome.steps:  # committed into its trajectory: its owner is known (owners.recorded)
        owners.recorded(ident, key)
    return outcome


async def upstream_fault(
    f: upstream.UpstreamFault, endpoint: str, ident: Identity | None, key: VerifiedKey
) -> HttpError:
    """An upstream that could not be reached or timed out: stored as an Event, returned as
    the HttpError to raise (``raise await upstream_fault(...) from None``)."""
    await fault_event(f.status, f.kind, f.message, endpoint, ident, key)
    return HttpError(f.status, f.message, code=f.kind)


async def invalid_answer(message: str, endpoint: str, ident: Identity | None, key: VerifiedKey) -> HttpError:
    """An upstream answer that is not what was asked for (not a completion, not an event
    stream): a 502 ``invalid_answer``, stored as an Event."""
    await fault_event(502, "invalid_answer", message, endpoint, ident, key)
    return HttpError(502, message, code="invalid_answer")


async def too_large_answer(
    message: str, field: str, endpoint: str, ident: Identity | None, key: VerifiedKey
) -> HttpError:
    """An upstream answer with more ids than a step holds (limits.answer_problem), refused
    before it is parsed: a 400 ``too_large`` naming the answer's field, stored as an Event
    (no step)."""
    await fault_event(400, "too_large", message, endpoint, ident, key, event_type="record_failed")
    return HttpError(400, message, code="too_large", param=field)


async def fault_event(
    status: int,
    kind: str,
    message: str,
    endpoint: str,
    ident: Identity | None,
    key: VerifiedKey,
    *,
    event_type: str = "upstream_error",
) -> None:
    """Store a failed call as an Event (best effort: a database outage must not mask the
    fault the agent is about to receive)."""
    payload = {"status": status, "kind": kind, "endpoint": endpoint, "message": message}
    try:
        await run_db(
            gateway_event_record,
            type=event_type,
            payload=payload,
            trajectory_uid=ident.trajectory_uid if ident else None,
            source_id=key.source_id,
        )
    except Exception:  # noqa: BLE001 - see docstring
        log.exception("could not record a gateway event (%s %s)", event_type, kind)
