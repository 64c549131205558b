"""Domain errors raised by pool services. The API layer maps them to HTTP: they are
ClientErrors (claw_kit/web/errors.py), which every door answers in its error shape."""

from __future__ import annotations

from claw_kit.web.errors import ClientError


class PoolError(ClientError):
    """Base class. ``field`` names the offending input (e.g. ``steps[3].step_index``)."""

    status_code = 400
    code = "invalid"


class InvalidInput(PoolError):
    status_code = 400
    code = "invalid"


class Conflict(PoolError):
    """The request contradicts stored data (e.g. different content under an existing uid)."""

    status_code = 409
    code = "conflict"


class RewardDelivered(Conflict):
    """A reward change for a trajectory whose steps were already delivered (leased or in a
    snapshot: Trajectory.delivered_at): answered 409 and nothing changes. What a trainer got
    is what the pool keeps; a corrected score belongs on a new rollout."""

    code = "reward_delivered"


class NotFound(PoolError):
    status_code = 404
    code = "not_found"


class Gone(PoolError):
    """What was asked for existed and was dropped on purpose (a lease's served batch past
    its replay window: curation/services/retention.py); the message says when and why."""

    status_code = 410
    code = "gone"


class Unprocessable(PoolError):
    """Well-formed input the pool cannot act on (no reward function for its data source,
    response text unknown, a reward function that failed on it)."""

    status_code = 422
    code = "unprocessable"


class UidTaken(Conflict):
    """A uid another source holds (pool/tenancy.py): answered 409 and nothing more."""

    code = "uid_taken"

    def __init__(self, kind: str, uid: str, *, field: str | None = None):
        super().__init__(f"{kind} uid {uid!r} is taken", field=field)
