"""The proxied calls' writer thread (gateway/proxy/db.py GroupWriter): what waits while it
writes is written together next, each caller gets its own item's result, a failed group
fails its callers only, and a caller that went away does not disturb the others.

What a group commit writes is tests/pool/test_ingest_group.py; through the gateway, every
proxied-call test on PostgreSQL and SQLite runs with it on (CLAW_PROXY_GROUP_COMMIT)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gateway.proxy.db import GroupWriter

DEADLINE_S = 10.0


class Recorder:
    """A write function that records its groups and holds the first one until released."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def write(self, items: list[int]) -> list[int]:
        self.groups.append(list(items))
        self.started.set()
        if len(self.groups) == 1:
            assert self.release.wait(DEADLINE_S)
        if any(i < 0 for i in items):
            raise ValueError("a negative item fails its group")
        return [i * 10 for i in items]


async def _until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


async def test_what_waits_while_a_group_is_written_is_the_next_group_and_each_gets_its_own_result():
    rec = Recorder()
    writer: GroupWriter[int, int] = GroupWriter(rec.write, name="test-writer", most=3)
    # given: a first item being written (held)
    first = asyncio.ensure_future(writer.submit(1))
    await _until(rec.started.is_set, "the first group")
    # when: five more arrive meanwhile, then the first group is released
    rest = [asyncio.ensure_future(writer.submit(i)) for i in range(2, 7)]
    await _until(lambda: writer._queue.qsize() == 5, "the five waiting items")
    rec.release.set()
    results = await asyncio.wait_for(asyncio.gather(first, *rest), DEADLINE_S)
    # then: they were written as groups of at most 3, in order, and each got its own result
    assert rec.groups == [[1], [2, 3, 4], [5, 6]]
    assert results == [10, 20, 30, 40, 50, 60]


async def test_a_failed_group_fails_its_callers_only_and_the_writer_goes_on():
    rec = Recorder()
    rec.release.set()
    writer: GroupWriter[int, int] = GroupWriter(rec.write, name="test-writer")
    assert await writer.submit(1) == 10
    # when: a group fails
    with pytest.raises(ValueError, match="negative"):
        await asyncio.wait_for(writer.submit(-1), DEADLINE_S)
    # then: the next caller is served
    assert await asyncio.wait_for(writer.submit(2), DEADLINE_S) == 20


async def test_a_caller_that_went_away_leaves_the_others_their_results():
    rec = Recorder()
    writer: GroupWriter[int, int] = GroupWriter(rec.write, name="test-writer")
    first = asyncio.ensure_future(writer.submit(1))
    await _until(rec.started.is_set, "the first group")
    gone = asyncio.ensure_future(writer.submit(2))
    stays = asyncio.ensure_future(writer.submit(3))
    await _until(lambda: writer._queue.qsize() == 2, "the waiting items")
    gone.cancel()  # e.g. the agent disconnected while its call was being recorded
    rec.release.set()
    assert await asyncio.wait_for(asyncio.gather(first, stays), DEADLINE_S) == [10, 30]
    assert rec.groups == [[1], [2, 3]]  # its item was still written, as a call's steps are
