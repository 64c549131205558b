"""The per-process hint of each trajectory's latest append (pool/ingest/claim.py
``RecentAppends``): an LRU bounded by the tokens it holds."""

from __future__ import annotations

import numpy as np

from pool.ingest.claim import RecentAppends, Tail
from pool.ingest.plan import Stored


def tail(end: int, tokens: int) -> Tail:
    return Tail(end=end, steps=[Stored(id=end, depth=0, full=np.arange(tokens, dtype=np.int32))])


def test_a_hint_is_found_only_at_its_end_index():
    # given a hint ending at index 3
    recent = RecentAppends(max_tokens=100)
    recent.put("t", tail(3, 10))
    # then it is the hint at 3, and no hint at another index
    assert recent.get("t", 3) is not None
    assert recent.get("t", 4) is None
    assert recent.latest("t").end == 3
    assert recent.latest("other") is None


def test_the_least_recently_used_hint_goes_first_past_max_tokens():
    # given two hints filling the budget, the first used since
    recent = RecentAppends(max_tokens=20)
    recent.put("a", tail(1, 10))
    recent.put("b", tail(1, 10))
    assert recent.latest("a") is not None
    # when a third one comes
    recent.put("c", tail(1, 5))
    # then the least recently used ("b") was dropped
    assert recent.latest("b") is None
    assert recent.latest("a") is not None and recent.latest("c") is not None


def test_a_new_hint_replaces_the_old_one_and_an_oversized_one_is_not_kept():
    recent = RecentAppends(max_tokens=20)
    recent.put("a", tail(1, 10))
    recent.put("a", tail(2, 15))  # replaces: 15 tokens held, not 25
    recent.put("b", tail(1, 5))
    assert recent.latest("a").end == 2 and recent.latest("b") is not None
    # a tail larger than the whole budget is not kept, and the trajectory's old hint is gone
    recent.put("a", tail(3, 21))
    assert recent.latest("a") is None
    assert recent.latest("b") is not None
    recent.clear()
    assert recent.latest("b") is None
