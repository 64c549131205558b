"""Tenancy by source: which sources' rows a writer or a reader may touch.

Every API key belongs to one Source and may be granted more (``ApiKey.extra_source_ids``); a
key writes into the trajectories, groups, steps, rewards, feedback and response chains of
those sources only, and reads only theirs unless it holds the ``read`` or ``admin`` scope.
Staff sessions and admin keys are unrestricted. pool/access/auth.py turns a request into
the ``sources`` the services and selectors take:

* ``None``: unrestricted (admin keys, staff sessions, the pool's own follow-up writes);
* a frozenset of source ids: only rows of those sources (a row without a source is nobody's,
  so only an unrestricted caller touches it);
* ``OWN`` (the services' default): the writer's ``source_id`` alone, or unrestricted when
  there is none (manage.py, the demo, an operator's session).

Reading another source's row answers 404 like an unknown uid; writing a uid another source
holds answers 409 ``uid_taken`` (pool.errors.UidTaken) and changes nothing.

One access rule for every read, applied in the query (each selector takes ``sources``): a
key or user reads its own sources' rows unless it holds a scope documented to read across
them. Those scopes:

* ``read`` and ``admin`` (and staff sessions): every source's rows, on every read path;
* ``consume``, for what datasets serve only (``pool.access.auth.served_sources_of``): a
  trainer is served every source's units a dataset admits (consumption is not filtered by
  source), so a dataset's preview, the dataset catalogue, snapshots, a consumer's progress
  and the images of its batches are every source's to it. Its other reads are its own
  sources'.

Counts follow the rows: ``GET /stats``, a preview, the task list count only what the reader
may read. The statistics of a *shared* task (no source) are the pool's: every source's
rollouts count in them, which is what sharing a task is for. tests/test_tenancy_matrix.py
holds a row for every /api/v1/ endpoint, checked against the URL conf.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db.models import Q


class _Own:
    def __repr__(self) -> str:
        return "OWN"


OWN: object = _Own()

Sources = frozenset[int] | None


def allowed(source_id: int | None, sources: Iterable[int] | None | object = OWN) -> Sources:
    """The sources a caller may touch (None: any), from its own source and ``sources``."""
    if sources is OWN:
        return None if source_id is None else frozenset((source_id,))
    return None if sources is None else frozenset(sources)  # type: ignore[arg-type]


def owns(sources: Sources, row_source_id: int | None) -> bool:
    """Whether a row of ``row_source_id`` is within ``sources``."""
    return sources is None or row_source_id in sources


def q(field: str, sources: Sources) -> Q:
    """The filter ``field`` in ``sources`` (everything when unrestricted)."""
    return Q() if sources is None else Q(**{f"{field}__in": sorted(sources)})
