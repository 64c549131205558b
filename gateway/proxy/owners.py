"""Another source's trajectory or prompt group, refused before the upstream.

A proxied call names where its steps go (its Identity: the path, X-Claw-Trajectory,
X-Claw-Prompt-Group, or the trajectory a Responses ``previous_response_id`` continues). When
another source holds that trajectory or group, recording the answer would be refused
(pool.ingest: 409 ``uid_taken``) after the upstream had done the work, spending inference
for an agent that may not write there. So every door (runner.serve) calls
:func:`refuse_foreign` once the call is translated and before any byte goes upstream: the
refusal is a plain 409 in the door's error shape, streamed calls included, and nothing is
stored.

The rules are the pipeline's (pool/tenancy.py): a trajectory is writable by its own
sources only (one without a source by unrestricted writers only); a prompt group by its own
sources, and a shared one (no source) by anyone, except that naming a task for it
(X-Claw-Task: the group is updated, pool.services.groups.group_upsert) takes its own group.

This is a check ahead of the work, not the guard: the record itself still checks in the
same statement that claims the trajectory, so a trajectory claimed by another source
between this check and the record is refused there and nothing is written (an answer
already streamed then ends with the door's ``record_failed`` error event).

A row's owner never changes, so the owners of rows found are remembered per process
(bounded): a call into a trajectory the process has seen costs no database round trip. A
remembered owner only ever lets a call through; a refusal is read from the database afresh,
and a uid not found is not remembered (another source may create it at any moment). A
trajectory's owner is also remembered once a call has written into it (:func:`recorded`), so
a named trajectory's first call, which found no row, is the only one that reads.
"""

from __future__ import annotations

import threading

from cachetools import LRUCache

from pool.errors import UidTaken
from pool.selectors.trajectories import write_target_owners
from pool.services.api_keys import VerifiedKey
from pool.tenancy import owns

from .db import run_db
from .recording import Identity

_KNOWN_MAX = 100_000  # (kind, uid) -> owner entries; ~200 B each
_known: LRUCache[tuple[str, str], int | None] = LRUCache(maxsize=_KNOWN_MAX)
_lock = threading.Lock()
_FIELDS = {"trajectory": "trajectory_uid", "prompt group": "prompt_group_uid"}


async def refuse_foreign(ident: Identity, key: VerifiedKey) -> None:
    """Raise UidTaken (409) when ``ident`` names a trajectory or prompt group that ``key``
    may not write into (module docstring); return quietly otherwise. Reads only."""
    sources = key.write_sources
    if sources is None:  # an admin key writes anywhere
        return
    named: dict[str, str | None] = {"prompt group": ident.prompt_group_uid}
    if not ident.new:  # a minted uid is fresh: no row can hold it yet
        named["trajectory"] = ident.trajectory_uid
    wanted = {kind: uid for kind, uid in named.items() if uid is not None}
    if not wanted:
        return
    unknown: dict[str, str] = {}
    with _lock:
        for kind, uid in wanted.items():
            # A remembered owner only lets a call through: a refusal is always read afresh.
            if (kind, uid) not in _known or not _may_write(kind, _known[(kind, uid)], ident, sources):
                unknown[kind] = uid
    if not unknown:
        return
    found = await run_db(
        write_target_owners,
        trajectory_uid=unknown.get("trajectory"),
        prompt_group_uid=unknown.get("prompt group"),
    )
    with _lock:
        for kind, owner in found.items():
            _known[(kind, unknown[kind])] = owner
    for kind in ("trajectory", "prompt group"):
        if kind in found and not _may_write(kind, found[kind], ident, sources):
            raise UidTaken(kind, unknown[kind], field=_FIELDS[kind])


def recorded(ident: Identity, key: VerifiedKey) -> None:
    """After ``key``'s call committed steps into ``ident``'s trajectory: with one write source,
    that source owns the trajectory (a restricted writer writes only into its own sources'
    trajectories, which the statement that claimed the row checked: pool/tenancy.py), so it
    is remembered and the trajectory's next call reads nothing. A minted trajectory is never
    checked, and a key with several sources does not tell which one owns it."""
    sources = key.write_sources
    if ident.new or sources is None or len(sources) != 1:
        return
    (owner,) = sources
    with _lock:
        _known[("trajectory", ident.trajectory_uid)] = owner


def _may_write(kind: str, owner: int | None, ident: Identity, sources: frozenset[int]) -> bool:
    if owner is None:  # shared: a group takes anyone's trajectories, unless the call names its task
        return kind == "prompt group" and ident.task is None
    return owns(sources, owner)
