"""Consumers and their leases belong to a source (curation/services/consume.py Actor).

docs/trainers.md: "Consumers are per source": a name is the caller's source's consumer
(another source's same name is another consumer: a pull as it is that source's own, and its
status 404 until it pulled); a key of another source gets 404 for the leases; admin keys and
operators act on every lease, read another source's consumer with ``?source=``, and only
they may release any lease (POST /api/v1/leases/{id}/release, audited)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from curation.models import Consumer, Lease
from curation.services.datasets import dataset_create
from pool.models import AuditEvent, Scope, Source
from pool.services.api_keys import api_key_create, api_key_rotate
from tests.conftest import client_for
from tests.curation.test_consume import ready_group

pytestmark = pytest.mark.django_db

ACTORS = ("same key", "same source", "other source", "admin key", "staff")


@pytest.fixture
def world(django_user_model):
    """Source team-a's consumer c-a holding one open lease (pulled by key a1), a second ready
    group, and a client per actor."""
    dataset_create(name="all")
    ready_group("g1")
    ready_group("g2")
    clients = {
        "same key": client_for(api_key_create(name="a1", scopes=[Scope.CONSUME], source_name="team-a")[1]),
        "same source": client_for(api_key_create(name="a2", scopes=[Scope.CONSUME], source_name="team-a")[1]),
        "other source": client_for(
            api_key_create(name="b1", scopes=[Scope.CONSUME], source_name="team-b")[1]
        ),
        "admin key": client_for(api_key_create(name="root", scopes=[Scope.ADMIN])[1]),
        "staff": APIClient(),
    }
    clients["staff"].force_login(django_user_model.objects.create_superuser("op", "op@example.com", "pw"))
    first = clients["same key"].post(
        "/api/v1/consumers/c-a/pull", {"dataset": "all", "batch_size": 1}, format="json"
    )
    assert first.status_code == 200, first.content
    return clients, first.json()["lease_id"], first.content


OPS = {
    "pull": ("post", "/api/v1/consumers/c-a/pull", {"dataset": "all", "batch_size": 1}),
    "ack": ("post", "/api/v1/leases/{lease}/ack", None),
    "nack": ("post", "/api/v1/leases/{lease}/nack", None),
    "replay": ("get", "/api/v1/leases/{lease}/batch", None),
    "status": ("get", "/api/v1/consumers/c-a", None),
    "release": ("post", "/api/v1/leases/{lease}/release", None),
}
OWNER = {"pull": 200, "ack": 200, "nack": 200, "replay": 200, "status": 200, "release": 403}
ADMIN = dict.fromkeys(OPS, 200)
# op -> (status, error param) for a key of another source: 404 like a lease that does not exist
FOREIGN = {op: (404, {"status": "name"}.get(op, "lease")) for op in OPS}
FOREIGN["pull"] = (200, None)  # names are per source: its own c-a, a consumer apart
FOREIGN["release"] = (403, None)  # no admin scope: refused before any lookup
# the seeded lease's status after each allowed op (None: unchanged, still leased)
LEASE_AFTER = {"ack": "acked", "nack": "released", "release": "released"}


def expected(actor: str, op: str) -> tuple[int, str | None]:
    if actor == "other source":
        return FOREIGN[op]
    return (ADMIN if actor in ("admin key", "staff") else OWNER)[op], None


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("actor", ACTORS)
def test_ownership_matrix(world, actor, op):
    # given team-a's consumer with an open lease, and a caller of this kind
    clients, lease_id, served = world
    method, path, body = OPS[op]
    if op == "status" and actor in ("admin key", "staff"):
        path += "?source=team-a"  # names are per source: an admin names whose consumer it reads
    leases_before = Lease.objects.count()
    status, param = expected(actor, op)
    # when it acts on that consumer or lease
    resp = getattr(clients[actor], method)(path.format(lease=lease_id), body, format="json")
    # then the answer is as expected, and what is stored too
    assert resp.status_code == status, resp.content
    lease = Lease.objects.get(id=lease_id)
    if status != 200:
        error = resp.json()["error"]
        assert error["param"] == param, error
        assert lease.status == Lease.Status.LEASED and lease.acked_at is None  # untouched
        assert Lease.objects.count() == leases_before
        assert not AuditEvent.objects.filter(action=AuditEvent.Action.LEASE_RELEASE).exists()
        return
    assert lease.status == LEASE_AFTER.get(op, Lease.Status.LEASED)
    if op == "pull":  # the next group, to the caller's source's c-a (team-a's for its keys)
        assert Lease.objects.count() == leases_before + 1
        assert resp.json()["manifest"]["consumer"] == "c-a"
        pulled_by = Lease.objects.get(id=resp.json()["lease_id"]).consumer
        owner = {"same key": "team-a", "same source": "team-a", "other source": "team-b"}.get(actor)
        assert (pulled_by.name, pulled_by.source.name if pulled_by.source else None) == (
            "c-a",
            owner or (None if actor == "staff" else pulled_by.source.name),
        )
        assert (pulled_by.source_id == lease.consumer.source_id) == (owner == "team-a")
    if op == "replay":
        assert resp.content == served
    if op == "status":
        assert resp.json()["name"] == "c-a"
    if op == "release":
        [audit] = AuditEvent.objects.filter(action=AuditEvent.Action.LEASE_RELEASE)
        assert audit.target == lease_id and audit.details["consumer"] == "c-a"
    assert Consumer.objects.get(name="c-a", source__name="team-a").source == Source.objects.get(name="team-a")


def test_a_foreign_nack_leaves_the_owners_ack_working(world):
    """The probe: another key replayed and nacked a lease, whose ack then failed (409)."""
    clients, lease_id, _ = world
    other = clients["other source"]
    assert other.post(f"/api/v1/leases/{lease_id}/nack").status_code == 404
    assert other.get(f"/api/v1/leases/{lease_id}/batch").status_code == 404
    assert other.post(f"/api/v1/leases/{lease_id}/ack").status_code == 404
    resp = clients["same key"].post(f"/api/v1/leases/{lease_id}/ack")
    assert resp.status_code == 200 and resp.json()["status"] == "acked"


def test_a_rotated_key_keeps_its_sources_consumers(world):
    clients, lease_id, _ = world
    from pool.models import ApiKey

    _, clear = api_key_rotate(prefix=ApiKey.objects.get(name="a1").prefix)
    rotated = client_for(clear)
    assert rotated.post(f"/api/v1/leases/{lease_id}/ack").status_code == 200
    assert rotated.get("/api/v1/consumers/c-a").status_code == 200


def test_a_name_taken_by_another_source_is_theirs(world):
    clients, _, _ = world
    # the other source pulls under its own name fine, and that consumer is its own
    resp = clients["other source"].post("/api/v1/consumers/c-b/pull", {"dataset": "all"}, format="json")
    assert resp.status_code == 200, resp.content
    assert Consumer.objects.get(name="c-b").source == Source.objects.get(name="team-b")
    assert clients["same key"].get("/api/v1/consumers/c-b").status_code == 404


def test_consumers_without_an_owner_are_the_operators(world):
    """README: "A consumer created by an operator session, or before owners existed
    (Consumer.source empty), is theirs alone." """
    clients, _, _ = world
    resp = clients["staff"].post("/api/v1/consumers/ops/pull", {"dataset": "all"}, format="json")
    assert resp.status_code == 200, resp.content
    lease = resp.json()["lease_id"]
    assert Consumer.objects.get(name="ops").source is None
    for actor in ("same key", "other source"):
        assert clients[actor].get("/api/v1/consumers/ops").status_code == 404
        assert clients[actor].post(f"/api/v1/leases/{lease}/ack").status_code == 404
    assert clients["admin key"].post(f"/api/v1/leases/{lease}/ack").status_code == 200


def test_release_of_an_acked_lease_is_a_409(world):
    clients, lease_id, _ = world
    assert clients["same key"].post(f"/api/v1/leases/{lease_id}/ack").status_code == 200
    resp = clients["admin key"].post(f"/api/v1/leases/{lease_id}/release")
    assert resp.status_code == 409 and resp.json()["error"]["param"] == "lease"
    assert Lease.objects.get(id=lease_id).status == Lease.Status.ACKED
