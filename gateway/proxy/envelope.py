"""The request envelope every gateway endpoint shares (the OpenAI doors, Messages,
Responses, count_tokens and the Claw-R1 compat views): POST only; the call's identity (its
trajectory from the path, X-Claw-Trajectory, else minted; its prompt group; its policy
version); its credential (an ingest key, or a capability URL's token: access.py); its JSON
body on demand; errors in the door's own shape; and the X-Claw-Trajectory answer header."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from claw_kit.uids import uuid4_hex
from claw_kit.web import guard
from claw_kit.web.body import check_length, json_object
from claw_kit.web.errors import HttpError, error_response
from claw_kit.web.query import decimal
from pool.errors import PoolError
from pool.ingest import rules
from pool.services.api_keys import VerifiedKey

from . import limits
from .access import authorise
from .errors import DoorInputError
from .recording import Identity

TRAJECTORY_HEADER = "X-Claw-Trajectory"

ErrorShape = Callable[..., HttpResponse]  # (status, message, *, code, param) -> the door's error


@dataclass(slots=True)
class Call:
    """One authorised call: its request, credential and identity (None for the compat views,
    which name no trajectory of their own)."""

    request: HttpRequest
    key: VerifiedKey
    ident: Identity | None
    scoped: bool  # the trajectory was named (path or header), not minted
    kept: Any = None  # an Idempotency-Key's claim (idempotency.Kept) while the call runs

    def body(self) -> dict[str, Any]:
        """The request's JSON object (400 for anything else, 413 past the body limit), within
        the guard's shape limits and storable as it is (rules.json_problem: no NUL, no
        integer beyond 64 bits), so nothing the upstream is sent fails to record later, and
        within the call's size limits (limits.py: token ids, characters of text), so nothing
        goes upstream that could never be a step."""
        length = self.request.META.get("CONTENT_LENGTH")
        check_length(decimal(length, max_digits=30))
        body = json_object(self.request.body)
        found = rules.value_problem(body)
        if found:
            at, reason = found
            raise HttpError(400, f"{at}: {reason}", code="invalid_request", param=at)
        limits.check_call(body)
        return body


async def receive(
    request: HttpRequest,
    handle: Callable[[Call], Awaitable[HttpResponseBase]],
    *,
    errors: ErrorShape = error_response,
    path_trajectory: str | None = None,
    path_group: str | None = None,
    api_key: str | None = None,
    capability: str | None = None,
    identity: bool = True,
    name_minted: bool = True,
) -> HttpResponseBase:
    """Answer ``request`` with ``handle(call)`` inside the envelope (module docstring).
    ``identity=False``: no identity (the capability is checked against ``path_trajectory``),
    no header; ``name_minted=False``: the header only names a trajectory the call named. A
    handler that continues another trajectory (a Responses previous_response_id) sets
    ``call.ident``; the header names it once the handler returned."""
    ident: Identity | None = None
    try:
        if request.method != "POST":
            raise HttpError(405, f"method {request.method} not allowed; use POST", code="method_not_allowed")
        if identity:
            ident = call_identity(request, path_trajectory, path_group)
            traj: str | None = ident.trajectory_uid
        else:
            traj = path_trajectory
            problem = traj is not None and guard.ident_problem(traj)
            if problem:
                raise HttpError(400, f"the trajectory uid {problem}", code="invalid_uid")
        key = await authorise(request, api_key=api_key, capability=capability, trajectory_uid=traj)
        call = Call(request, key, ident, path_trajectory is not None or (ident is not None and not ident.new))
        response = await handle(call)
        ident = call.ident
    except DoorInputError as e:
        response = errors(e.status, e.message, code="invalid_request", param=e.param)
    except HttpError as e:
        response = errors(e.status, e.message, code=e.code, param=e.param)
    except PoolError as e:
        response = errors(e.status_code, e.message, code=e.code, param=e.field)
    if ident is not None and (name_minted or not ident.new):
        response[TRAJECTORY_HEADER] = ident.trajectory_uid
    return response


def call_identity(request: HttpRequest, path_trajectory: str | None, path_group: str | None) -> Identity:
    """The call's trajectory, prompt group and policy version (400 for a bad one)."""
    meta = request.META
    traj = path_trajectory or meta.get("HTTP_X_CLAW_TRAJECTORY") or None
    new = traj is None
    if traj is None:
        traj = uuid4_hex()
    group = path_group if path_group is not None else meta.get("HTTP_X_CLAW_PROMPT_GROUP") or None
    if group == "-":  # the scoped URL's "no group"
        group = None
    task = meta.get("HTTP_X_CLAW_TASK") or None  # the task the group rolls out
    for name, value in (("trajectory", traj), ("prompt group", group), ("task", task)):
        if value is not None and (not value.strip() or len(value) > rules.MAX_UID_LEN):
            raise HttpError(
                400, f"the {name} uid must be 1 to {rules.MAX_UID_LEN} characters", code="invalid_uid"
            )
        # Checked before anything is sent or stored: the uid is echoed in a response header.
        problem = value is not None and guard.ident_problem(value)
        if problem:
            raise HttpError(400, f"the {name} uid {problem}", code="invalid_uid")
    version = meta.get("HTTP_X_CLAW_POLICY_VERSION")
    policy_version = None
    if version not in (None, ""):
        try:
            policy_version = int(version)
        except ValueError:
            policy_version = -1
        if not 0 <= policy_version < 2**63:
            raise HttpError(
                400, "X-Claw-Policy-Version must be a non-negative integer", code="invalid_policy_version"
            )
    return Identity(
        trajectory_uid=traj, prompt_group_uid=group, policy_version=policy_version, new=new, task=task
    )
