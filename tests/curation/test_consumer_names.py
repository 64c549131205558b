"""Consumer names are per source (curation.models.Consumer, selectors.consumption.consumer_of):
two sources that both call their consumer "trainer" get one each, neither collides with nor
reveals the other, and only admins read another source's consumer (``?source=``)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from curation.models import Consumer, Lease
from curation.services.datasets import dataset_create
from pool.models import Scope
from pool.services.api_keys import api_key_create
from tests.conftest import client_for
from tests.curation.test_consume import ready_group

pytestmark = pytest.mark.django_db


def norm(resp, name: str) -> str:
    return resp.content.decode().replace(name, "<name>")


def test_two_sources_trainers_are_two_consumers(django_user_model):
    """docs/trainers.md: "Consumers are per source: a consumer name means the caller's
    source's consumer, made on the source's first pull under that name." "Every key of that
    source, a rotated one too, may pull, ack, nack, replay and read its status." (the rotated
    key: tests/curation/test_ownership.py) "Another source using the same name (two teams both
    calling theirs trainer) gets a consumer of its own: the two never collide, and neither can
    see the other's." "A key of another source gets 404 for a source's leases, as if they did
    not exist." "Admin keys pull as their own source." "Admin keys and operators ack, nack,
    replay and release any lease by id, and only they may release one (POST
    /api/v1/leases/{id}/release, audited)." (the matrix of tests/curation/test_ownership.py)
    "Only they may read another source's consumer, with GET
    /api/v1/consumers/{name}?source=<source name>; for anyone else source is a 400."
    "Without source, they read their own source's, else the only consumer of that name, and
    a 400 naming source when several sources have one." "An
    operator session's consumers, and those from before owners existed (Consumer.source
    empty), are unowned and are theirs alone." (tests/curation/test_ownership.py
    test_consumers_without_an_owner_are_the_operators)"""
    # given: a ready group, sources team-a and team-b (consume keys), an admin key, an operator
    dataset_create(name="all")
    ready_group("g1")
    a = client_for(api_key_create(name="ka", scopes=[Scope.CONSUME], source_name="team-a")[1])
    b = client_for(api_key_create(name="kb", scopes=[Scope.CONSUME], source_name="team-b")[1])
    admin = client_for(api_key_create(name="root", scopes=[Scope.ADMIN])[1])
    staff = APIClient()
    staff.force_login(django_user_model.objects.create_superuser("op", "op@example.com", "pw"))
    pull = {"dataset": "all", "batch_size": 1}
    # when: team-a pulls as "trainer"
    first = a.post("/api/v1/consumers/trainer/pull", pull, format="json")
    assert first.status_code == 200 and first.json()["lease_id"]
    a_lease = first.json()["lease_id"]
    # then: team-b's "trainer" does not exist yet: the same answer as a name nobody used
    taken, unknown = b.get("/api/v1/consumers/trainer"), b.get("/api/v1/consumers/nobody")
    assert (taken.status_code, norm(taken, "trainer")) == (unknown.status_code, norm(unknown, "nobody"))
    assert taken.status_code == 404 and taken.json()["error"]["param"] == "name"
    # when: team-b pulls as "trainer" too
    second = b.post("/api/v1/consumers/trainer/pull", pull, format="json")
    # then: it is its own consumer, so it gets the same group (each consumer gets each unit once)
    assert second.status_code == 200, second.content
    assert second.json()["manifest"]["step_uids"] == first.json()["manifest"]["step_uids"]
    owners = sorted(Consumer.objects.filter(name="trainer").values_list("source__name", flat=True))
    assert owners == ["team-a", "team-b"]
    # and: each door answers per source (who, method, path, status, error param)
    table = [
        (a, "get", "/api/v1/consumers/trainer", 200, None),
        (b, "get", "/api/v1/consumers/trainer", 200, None),
        (b, "get", f"/api/v1/leases/{a_lease}/batch", 404, "lease"),
        (b, "post", f"/api/v1/leases/{a_lease}/ack", 404, "lease"),
        (b, "get", "/api/v1/consumers/trainer?source=team-a", 400, "source"),
        (admin, "get", "/api/v1/consumers/trainer?source=team-a", 200, None),
        (staff, "get", "/api/v1/consumers/trainer?source=team-b", 200, None),
        (admin, "get", "/api/v1/consumers/trainer?source=nope", 404, "source"),
        # an admin's own never pulled, and two sources have one: it must name which
        (admin, "get", "/api/v1/consumers/trainer", 400, "source"),
        (staff, "get", "/api/v1/consumers/trainer", 400, "source"),
    ]
    got = {}
    for who, method, path, status, param in table:
        resp = getattr(who, method)(path)
        assert resp.status_code == status, (path, resp.content)
        if param is not None:
            assert resp.json()["error"]["param"] == param, (path, resp.content)
        got[(id(who), path)] = resp
    # and: the admin's view of team-a's consumer is team-a's own, field by field, and team-b's
    # shows only its own lease
    own_a = got[(id(a), "/api/v1/consumers/trainer")].json()
    assert got[(id(admin), "/api/v1/consumers/trainer?source=team-a")].json() == own_a
    own_b = got[(id(b), "/api/v1/consumers/trainer")].json()
    assert got[(id(staff), "/api/v1/consumers/trainer?source=team-b")].json() == own_b
    assert own_a["created_at"] != own_b["created_at"] or own_a != own_b
    for body in (own_a, own_b):
        [ds] = body["datasets"]
        assert (body["name"], ds["dataset"], ds["leases"]["leased"], ds["delivered_units"]) == (
            "trainer",
            "all",
            1,
            1,
        )
    # and: team-a's lease is still open, its ack works
    assert Lease.objects.get(id=a_lease).status == Lease.Status.LEASED
    assert a.post(f"/api/v1/leases/{a_lease}/ack").status_code == 200
