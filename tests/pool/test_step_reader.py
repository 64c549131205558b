"""The one step reader (pool.selectors.steps.steps_read): every way in returns what was
written, field by field, on both backends. Its JSON columns are read as text and parsed with
orjson, its id lists bound with ``__any`` (pool/lookups.py): awkward JSON values (escapes,
line separators, floats at the edges of precision, 64-bit integers, nulls inside) and id
lists (empty, repeated, unknown ids) are the cases."""

from __future__ import annotations

import pytest

from pool.ingest.pipeline import steps_ingest
from pool.lookups import Many
from pool.models import Step
from pool.selectors.steps import step_get, steps_listed, steps_read, steps_render
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

METADATA = {
    "text": 'quote " backslash \\ tab \t line sep \u2028 emoji \U0001f600 nul-free',
    "floats": [0.1, 1e-300, 1.7976931348623157e308, -2.5, 123456789.125],
    "ints": [0, -1, 2**63 - 1, -(2**63)],
    "nested": {"a": [None, True, False, {"b": []}], "": "empty key"},
}
MESSAGES = [
    {"role": "system", "content": "you are \u00e9\u4e2d"},
    {"role": "user", "content": [{"type": "text", "text": "part"}], "name": None},
]


def written() -> dict[str, dict]:
    steps = [
        step_in("rd", 0, prompt=[1, 2, 3], response=[4, 5], metadata=METADATA, messages=MESSAGES,
                response_text="answer \u2028 text"),
        step_in("rd", 1, prompt=[1, 2, 3, 4, 5, 6], response=[7], metadata={}, is_last=True),
    ]  # fmt: skip
    steps_ingest(steps=steps)
    return {s.uid: s for s in steps}


def test_every_way_in_returns_the_written_json_and_ids_exactly():
    # given: two steps, one with awkward metadata, messages and response text
    sent = written()
    # (in id order: a query without ORDER BY returns PostgreSQL's heap order, which an
    # update of the first step can change; CI's PostgreSQL pass saw rd:1 first once)
    ids = dict(Step.objects.order_by("id").values_list("uid", "id"))
    # when: read by id (with and without the texts), in a database order, as the API's value
    # rows (list and detail), and from Step instances
    reads = {
        "by id": steps_read(list(ids.values())).rows,
        "without texts": steps_read(list(ids.values()), texts=False).rows,
        "ordered": steps_read(list(ids.values()), order=("-step_index",)).rows[::-1],
        "api list": steps_render(list(steps_listed().order_by("id"))),
        "api detail": steps_render([step_get(uid="rd:0"), step_get(uid="rd:1")]),
        "instances": steps_render(list(Step.objects.order_by("id"))),
    }
    # then: each returns both steps, in order, with what was written, field by field
    for how, rows in reads.items():
        assert [r["uid"] for r in rows] == ["rd:0", "rd:1"], how
        for r in rows:
            s = sent[r["uid"]]
            assert r["metadata"] == s.metadata, how
            assert r["prompt_ids"].tolist() == s.prompt_ids.tolist(), how
            assert r["response_ids"].tolist() == s.response_ids.tolist(), how
            assert (r["trajectory_uid"], r["step_index"], r["is_last"]) == ("rd", s.step_index, s.is_last), (
                how
            )
            if how == "without texts":
                assert "messages" not in r and "response_text" not in r
            else:
                assert r["messages"] == s.messages and r["response_text"] == s.response_text, how


def test_id_lists_empty_repeated_and_unknown():
    written()
    first, second = Step.objects.order_by("id").values_list("id", flat=True)
    # an empty list reads nothing (no query), an unknown id is left out, a repeated id is
    # read once per time it is asked for, in the order asked
    assert steps_read([]).rows == []
    assert [r["uid"] for r in steps_read([second, 10**12, first, second]).rows] == ["rd:1", "rd:0", "rd:1"]
    # __any is membership on both backends, empty included
    assert set(Step.objects.filter(id__any=Many([first, first])).values_list("uid", flat=True)) == {"rd:0"}
    assert not Step.objects.filter(id__any=Many([])).exists()
    assert Step.objects.filter(trajectory__any=Many([Step.objects.get(id=first).trajectory_id])).count() == 2


def test_any_refuses_a_bare_list_by_name_and_takes_many_a_set_or_a_generator():
    """A list given to ``__any`` would be resolved by Django value by value (pool/lookups.py):
    refused, naming the field, so a slow call site cannot land; Many, a set and a one-shot
    iterable read the same rows."""
    written()
    first, second = Step.objects.order_by("id").values_list("id", flat=True)
    for bare in ([first], (first,)):
        with pytest.raises(TypeError, match=r"^id__any takes Many\(values\) or a set, not a (list|tuple)"):
            list(Step.objects.filter(id__any=bare))
    for ids in (Many([second, first]), {first, second}, Many(i for i in (first, second))):
        assert sorted(Step.objects.filter(id__any=ids).values_list("uid", flat=True)) == ["rd:0", "rd:1"]


@pytest.mark.parametrize("lookup", ["in", "any"])
def test_an_empty_id_list_matches_nothing_and_runs_no_statement(lookup):
    """``__any`` replaces ``__in`` on the write path's long lists (rewards, readiness,
    completion, ingest): where a list can be empty (no group became ready, no trajectory to
    refresh) it must cost nothing, as ``__in`` does, on both backends; an exclude of it keeps
    every row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    written()
    empty = [] if lookup == "in" else Many([])
    with CaptureQueriesContext(connection) as q:
        assert list(Step.objects.filter(**{f"id__{lookup}": empty}).values_list("id", flat=True)) == []
        assert Step.objects.filter(**{f"uid__{lookup}": set()}).update(reward=1.0) == 0
    assert q.captured_queries == []
    assert Step.objects.exclude(**{f"id__{lookup}": empty}).count() == 2
    assert Step.objects.filter(reward=1.0).count() == 0
