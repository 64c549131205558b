"""Array parameters written as one literal (pool/lookups.py ``array_literal``) read back on
PostgreSQL as exactly the values sent, for every kind a write binds that way (the settle's
own rewards, the trajectories' end): one row per kind, the literal against the values."""

from __future__ import annotations

import math
import struct

import pytest
from django.db import connection

from pool import sql
from pool.lookups import array_literal

pytestmark = pytest.mark.django_db

HARD_FLOATS = [0.1, 1 / 3, -0.0, 5e-324, 1.7976931348623157e308, 2.0**-1074 * 3, 0.30000000000000004, None]
ROWS = [
    ("bigint", [1, None, 2**62, -(2**63)]),
    ("integer", [0, -1, 2**31 - 1, None]),
    ("double precision", HARD_FLOATS + [math.inf, -math.inf, math.nan]),
    ("varchar", ["final", "", 'a"b', "c\\d", "x,y{z}", "NULL", " spaced ", "é ü 中", "it's", None]),
    ("boolean", [True, False, None]),
    ("double precision", [None, None]),
]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize(("pg_type", "values"), ROWS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(ROWS)])
def test_an_array_literal_reads_back_as_the_values_sent(pg_type, values):
    if connection.vendor != "postgresql":
        pytest.skip("array literals are PostgreSQL's")
    literal = array_literal(values)
    assert literal is not None
    with connection.cursor() as cur:  # Django's client-binding cursor, as the writes use
        cur.execute(f"SELECT unnest(CAST(%s AS {pg_type}[]))", [literal])
        got = [r[0] for r in cur.fetchall()]
    assert len(got) == len(values) and all(same(g, v) for g, v in zip(got, values, strict=True)), (
        got,
        values,
    )


def test_values_of_other_kinds_are_left_to_the_driver():
    import numpy as np

    # a numpy float's repr is not its value's text; bytes and mixed kinds are no literal
    for values in ([np.float64(0.5)], [b"\x00"], [1, 2.0], [1, "a"]):
        assert array_literal(values) is None


def test_the_rows_cte_reads_back_each_column_as_sent():
    if connection.vendor != "postgresql":
        pytest.skip("the unnest form is PostgreSQL's")
    rows = [
        (1, 0.1, "final", True, None),
        (2, None, 'q"uote', False, b"\x01\x02"),
        (3, -0.0, None, None, b""),
    ]
    cte, params = sql._rows(
        ("id", "r", "s", "b", "blob"), ("bigint", "double precision", "varchar", "boolean", "bytea"), rows
    )
    assert [type(p) for p in params][:4] == [str] * 4  # literals, but the bytes column as a list
    with connection.cursor() as cur:
        cur.execute(f"WITH {cte} SELECT id, r, s, b, blob FROM v ORDER BY id", params)
        got = [tuple(bytes(x) if isinstance(x, memoryview) else x for x in r) for r in cur.fetchall()]
    assert len(got) == len(rows)
    for g, w in zip(got, rows, strict=True):
        assert all(same(x, y) for x, y in zip(g, w, strict=True)), (g, w)


def test_a_uid_lookup_by_many_finds_uids_that_need_quoting():
    # given trajectories whose uids hold the characters an array literal must quote
    from pool.ingest.pipeline import steps_ingest
    from pool.lookups import Many
    from pool.models import Trajectory
    from tests.pool.factories import step_in

    uids = ['a"b', "c\\d", "x,y{z}", "NULL", " spaced ", "é ü 中", "it's", "plain"]
    steps_ingest(steps=[step_in(u, 0, prompt=[1, 2], response=[3]) for u in uids])
    # when they are looked up as one array parameter (lookups.array_param), with one absent uid
    found = Trajectory.objects.filter(uid__any=Many([*uids, "absent"])).values_list("uid", flat=True)
    # then exactly they come back
    assert sorted(found) == sorted(uids)
