"""The live events' types (pool/live_payloads.py): one TypedDict per kind, with a Literal kind."""

from __future__ import annotations

from typing import get_args, get_type_hints

from pool import live
from pool import live_payloads as events


def test_every_kind_the_notifier_routes_has_one_typed_event():
    # given: the typed events of the union
    kinds = [get_args(get_type_hints(e)["kind"])[0] for e in get_args(events.LiveEvent)]
    # then: one per kind, and exactly the kinds the notifier routes to topics
    assert len(kinds) == len(set(kinds))
    assert set(kinds) == set(live.KIND_TOPICS)
