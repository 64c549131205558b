"""``Idempotency-Key`` on the proxied doors (the kept answers: pool/services/idempotency.py).

A call that names a key claims it for its source before anything goes upstream. A retry of a
finished call gets its answer back, byte for byte, with the same X-Claw-Trajectory and
X-Claw-Steps headers and ``Idempotent-Replayed: true``, and stores nothing; a retry while the
first still runs gets 409 ``idempotency_in_progress`` with Retry-After; the same key with
another request (path or body) 422 ``idempotency_mismatch``; a key whose call died without
an outcome 409 ``idempotency_unknown`` (send a new key). A call that ends without a commit
(an upstream fault, a refused record, a broken stream) gives the key back.

The crash window: the answer is kept (``Kept.complete``) in its own transaction after the
call's steps are committed (runner.serve; streamed: runner._relayed, before the closing
events). A process killed between the two leaves the key claimed with no answer, and the
outcome of a retry with the same key is, by design:

* within CLAW_IDEMPOTENCY_RUNNING_SECONDS of the first call: 409 ``idempotency_in_progress``
  (Retry-After), as if it still ran;
* after that: 409 ``idempotency_unknown``, for as long as the key is kept
  (CLAW_IDEMPOTENCY_TTL_SECONDS).

Never is the call run again under that key, so its step is never stored twice; the agent
(which got no answer, or a stream cut before its end) looks its trajectory up or sends the
call again with a new key. tests/gateway/test_idempotency.py kills a server at that exact
point (faults.crash_point) and retries.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from django.http import HttpRequest, HttpResponse

from claw_kit.web.errors import HttpError
from pool.services.idempotency import idempotency_claim, idempotency_complete, idempotency_release

from .db import run_db

HEADER = "Idempotency-Key"
MAX_KEY_LEN = 255
KEPT_HEADERS = ("X-Claw-Trajectory", "X-Claw-Steps")


def key_of(request: HttpRequest) -> str | None:
    """The request's Idempotency-Key (None without one); 400 for one that is empty, too long
    or not printable ASCII."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY_LEN or not all(32 < ord(c) < 127 for c in key):
        raise HttpError(
            400,
            f"{HEADER} must be 1-{MAX_KEY_LEN} printable ASCII characters",
            code="invalid_request",
            param=HEADER,
        )
    return key


@dataclass(slots=True)
class Kept:
    """A claimed key: what its call sent, kept when the call's steps are committed."""

    call_id: int
    chunks: list[bytes] = field(default_factory=list)
    settled: bool = False

    async def complete(self, status: int, content_type: str, headers: dict[str, str], body: bytes) -> None:
        self.settled = True
        await run_db(
            idempotency_complete,
            call_id=self.call_id,
            status=status,
            content_type=content_type,
            headers=headers,
            body=body,
        )

    async def release(self) -> None:
        if not self.settled:
            self.settled = True
            await run_db(idempotency_release, call_id=self.call_id)


async def claim(request: HttpRequest, key: str, source_id: int, errors: Any) -> Kept | HttpResponse:
    """Claim ``key`` for this call (a Kept), or the answer a retry gets instead. The request
    is fingerprinted by its path and body bytes, as a client's retry sends them again (no
    second parse of a body the door has already read)."""
    digest = hashlib.sha256(request.path.encode())
    digest.update(b"\0")
    digest.update(request.body)
    fingerprint = digest.hexdigest()
    got = await run_db(idempotency_claim, source_id=source_id, key=key, fingerprint=fingerprint)
    if got.state == "new":
        return Kept(got.call.id)
    if got.state == "done":
        response = HttpResponse(
            bytes(got.call.body), status=got.call.status, content_type=got.call.content_type
        )
        for name, value in got.call.headers.items():
            response[name] = value
        response["Idempotent-Replayed"] = "true"
        return response
    if got.state == "mismatch":
        return errors(
            422, f"this {HEADER} was used with another request", code="idempotency_mismatch", param=HEADER
        )
    if got.state == "unknown":
        return errors(
            409,
            f"the call first sent with this {HEADER} did not finish and its outcome is unknown; use a new key",
            code="idempotency_unknown",
            param=HEADER,
        )
    response = errors(
        409,
        f"a call with this {HEADER} is still running; retry shortly",
        code="idempotency_in_progress",
        param=HEADER,
    )
    response["Retry-After"] = "1"
    return response


def kept_headers(response: HttpResponse | None, trajectory_uid: str | None) -> dict[str, str]:
    """The headers a replay carries: the answer's (none for a stream) and the trajectory's."""
    out = {name: response[name] for name in KEPT_HEADERS if response is not None and name in response}
    if trajectory_uid:
        out["X-Claw-Trajectory"] = trajectory_uid
    return out
