"""Idempotency keys of proxied calls (pool.IdempotentCall).

A call with an ``Idempotency-Key`` claims the key for its source before going upstream
(``idempotency_claim``). The first claim runs the call; a retry while it runs is told to wait,
a retry after it finished gets the kept answer, a retry with another request under the same
key is refused. A call that fails before its steps are committed gives its key back
(``idempotency_release``), so a retry runs it again; one whose steps are committed keeps its
answer (``idempotency_complete``). A claim older than CLAW_IDEMPOTENCY_TTL_SECONDS is
forgotten (the key may be used again); one still running past
CLAW_IDEMPOTENCY_RUNNING_SECONDS (its process died between the commit and the keeping, or
before either) has an unknown outcome and is never run again under that key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ..models import IdempotentCall

ClaimState = Literal["new", "running", "done", "mismatch", "unknown"]


@dataclass(frozen=True, slots=True)
class Claim:
    state: ClaimState
    call: IdempotentCall


@transaction.atomic
def idempotency_claim(*, source_id: int, key: str, fingerprint: str) -> Claim:
    """Claim ``key`` for ``source_id``'s call with ``fingerprint``, or say why not."""
    now = timezone.now()
    IdempotentCall.objects.filter(
        source_id=source_id,
        key=key,
        created_at__lt=now - timedelta(seconds=settings.CLAW_IDEMPOTENCY_TTL_SECONDS),
    ).delete()
    call, created = IdempotentCall.objects.get_or_create(
        source_id=source_id, key=key, defaults={"fingerprint": fingerprint, "created_at": now}
    )
    if created:
        return Claim("new", call)
    if call.fingerprint != fingerprint:
        return Claim("mismatch", call)
    if call.state == IdempotentCall.State.DONE:
        return Claim("done", call)
    running_for = (now - call.created_at).total_seconds()
    return Claim("unknown" if running_for > settings.CLAW_IDEMPOTENCY_RUNNING_SECONDS else "running", call)


def idempotency_complete(
    *, call_id: int, status: int, content_type: str, headers: dict[str, str], body: bytes
) -> None:
    """Keep the answer of the claimed call ``call_id`` (its steps are committed)."""
    IdempotentCall.objects.filter(id=call_id, state=IdempotentCall.State.RUNNING).update(
        state=IdempotentCall.State.DONE, status=status, content_type=content_type, headers=headers, body=body
    )


def idempotency_release(*, call_id: int) -> None:
    """Give the key of the claimed call ``call_id`` back (nothing of it was stored)."""
    IdempotentCall.objects.filter(id=call_id, state=IdempotentCall.State.RUNNING).delete()
