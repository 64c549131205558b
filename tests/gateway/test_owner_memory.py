"""gateway/proxy/owners.py's memory: which proxied calls read the owner of the trajectory they
name before anything goes upstream.

A named trajectory's first call finds no row (nothing remembered); once a call of a key with
one write source has committed steps into it (gateway/proxy/faults.record), its owner is that
source, remembered, and its next calls read nothing. Another source's call still reads
afresh and is refused, and a key with several sources is not taken to tell the owner.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.proxy import faults, owners
from gateway.proxy.recording import CHAT, Identity
from pool.errors import UidTaken
from pool.models import Source, Step, Trajectory
from pool.services.api_keys import VerifiedKey

# run_db's threads have their own connections: the rows must be committed to be seen
pytestmark = pytest.mark.django_db(transaction=True)

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {
    "object": "chat.completion",
    "model": "m",
    "prompt_token_ids": [5, 6, 7],
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
            "token_ids": [8, 9],
        }
    ],
}


@pytest.fixture
def reads(monkeypatch) -> list[dict]:
    """The owner reads refuse_foreign sends to the database (each still runs)."""
    seen: list[dict] = []
    real = owners.write_target_owners

    def counted(**kwargs):
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(owners, "write_target_owners", counted)
    owners._known.clear()
    yield seen
    owners._known.clear()


def _key(source: Source, *extra: Source) -> VerifiedKey:
    return VerifiedKey(
        key_id=source.id,
        source_id=source.id,
        source_name=source.name,
        scopes=frozenset({"ingest"}),
        extra_source_ids=frozenset(s.id for s in extra),
    )


def _call(ident: Identity, key: VerifiedKey) -> None:
    """One proxied call as the runner makes it: the owner check, then the record."""

    async def go() -> None:
        await owners.refuse_foreign(ident, key)
        outcome = await faults.record(CHAT, ident, key, REQUEST, ANSWER)
        assert outcome.steps, outcome

    asyncio.run(go())


def test_a_trajectorys_owner_is_read_once_then_known_from_the_write(reads):
    # given: a source's key and a trajectory it names, unknown to the pool
    a, b = Source.objects.create(name="a"), Source.objects.create(name="b")
    ident = Identity(trajectory_uid="owned-by-a")

    # when: its first three calls are made
    for _ in range(3):
        _call(ident, _key(a))

    # then: only the first read the owner (it found no row); the steps are a's, as sent
    assert reads == [{"trajectory_uid": "owned-by-a", "prompt_group_uid": None}]
    traj = Trajectory.objects.get(uid="owned-by-a")
    assert (traj.source_id, traj.step_count) == (a.id, 3)
    assert list(
        Step.objects.filter(trajectory=traj).order_by("step_index").values_list("step_index", "source_id")
    ) == [
        (0, a.id),
        (1, a.id),
        (2, a.id),
    ]

    # and: another source's call reads afresh and is refused before the upstream
    with pytest.raises(UidTaken):
        asyncio.run(owners.refuse_foreign(ident, _key(b)))
    assert len(reads) == 2


def test_a_key_with_several_sources_does_not_tell_the_owner(reads):
    # given: a key writing into two sources, and a trajectory it names
    a, b = Source.objects.create(name="a"), Source.objects.create(name="b")
    ident = Identity(trajectory_uid="two-sources")

    # when: two calls are made
    _call(ident, _key(a, b))
    _call(ident, _key(a, b))

    # then: the second read the owner too (the write did not say which source owns it), and
    # remembered what it found
    assert [r["trajectory_uid"] for r in reads] == ["two-sources", "two-sources"]
    assert owners._known[("trajectory", "two-sources")] == a.id
