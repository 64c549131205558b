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
