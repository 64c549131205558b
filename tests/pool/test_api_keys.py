"""API keys: rotation and revocation (service and manage.py), each in the audit log with
key creation and dataset changes."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from curation.services.datasets import dataset_create, dataset_update
from pool.errors import Conflict, NotFound
from pool.models import ApiKey, AuditEvent, Scope
from pool.services.api_keys import api_key_create, api_key_revoke, api_key_rotate, api_key_verify
from tests.conftest import client_for

pytestmark = pytest.mark.django_db


def audit() -> list[tuple[str, str, str]]:
    return list(AuditEvent.objects.order_by("id").values_list("action", "target", "actor"))


def test_rotation_replaces_the_key_and_revokes_the_old_one():
    # given a live key that works
    old, old_clear = api_key_create(name="trainer", scopes=[Scope.CONSUME, Scope.READ], actor="cli")
    assert client_for(old_clear).get("/api/v1/stats").status_code == 200
    # when it is rotated
    new, new_clear = api_key_rotate(prefix=old.prefix, actor="user:op")
    # then the new key has the same name, source and scopes, and works; the old one does not
    assert (new.name, new.source_id, new.scopes) == (old.name, old.source_id, old.scopes)
    assert new.prefix != old.prefix and new_clear != old_clear
    assert client_for(new_clear).get("/api/v1/stats").status_code == 200
    assert client_for(old_clear).get("/api/v1/stats").status_code == 401
    assert api_key_verify(old_clear) is None
    # and both actions are in the audit log
    assert audit() == [
        ("api_key.create", old.prefix, "cli"),
        ("api_key.rotate", old.prefix, "user:op"),
    ]
    assert AuditEvent.objects.get(action="api_key.rotate").details["new_prefix"] == new.prefix


def test_rotating_a_revoked_or_unknown_key_is_refused_and_writes_nothing():
    key, _ = api_key_create(name="k", scopes=[Scope.READ])
    api_key_revoke(prefix=key.prefix)
    keys, events = ApiKey.objects.count(), AuditEvent.objects.count()
    with pytest.raises(Conflict):
        api_key_rotate(prefix=key.prefix)
    with pytest.raises(NotFound):
        api_key_rotate(prefix="nope")
    assert (ApiKey.objects.count(), AuditEvent.objects.count()) == (keys, events)


def test_revocation_is_idempotent_and_audited_once():
    key, clear = api_key_create(name="agent", scopes=[Scope.INGEST])
    first = api_key_revoke(prefix=key.prefix, actor="cli")
    again = api_key_revoke(prefix=key.prefix, actor="cli")
    assert first.revoked_at == again.revoked_at is not None
    assert client_for(clear).get("/api/v1/stats").status_code == 401
    assert [a for a, _, _ in audit()] == ["api_key.create", "api_key.revoke"]


def test_management_commands_rotate_and_revoke():
    key, _ = api_key_create(name="cmd", scopes=[Scope.READ])
    out, err = io.StringIO(), io.StringIO()
    call_command("rotate_api_key", key.prefix, stdout=out, stderr=err)
    new_clear = out.getvalue().strip()
    assert api_key_verify(new_clear) is not None and f"revoked key {key.prefix}" in err.getvalue()
    new_prefix = new_clear.split("_")[1]
    call_command("revoke_api_key", new_prefix, stderr=io.StringIO())
    assert api_key_verify(new_clear) is None
    with pytest.raises(CommandError, match="prefix"):
        call_command("revoke_api_key", "missing", stderr=io.StringIO())


def test_dataset_creation_and_new_versions_are_audited():
    dataset_create(name="ds-a", actor="user:op")
    dataset_update(name="ds-a", spec={"filters": {"max_staleness": 3}}, actor="key:abc")
    dataset_update(
        name="ds-a", spec={"filters": {"max_staleness": 3}}, actor="key:abc"
    )  # unchanged: no version
    assert audit() == [("dataset.create", "ds-a", "user:op"), ("dataset.version", "ds-a", "key:abc")]
    assert AuditEvent.objects.last().details == {"version": 2}


def test_admin_can_revoke_keys_and_read_but_not_edit_the_log(operator):
    from django.test import Client

    key, clear = api_key_create(name="adm", scopes=[Scope.READ])
    client = Client()
    client.force_login(operator)
    resp = client.post("/admin/pool/apikey/", {"action": "revoke", "_selected_action": [key.pk]}, follow=True)
    assert resp.status_code == 200
    assert api_key_verify(clear) is None
    assert ("api_key.revoke", key.prefix, "user:operator") in audit()
    assert client.get("/admin/pool/auditevent/").status_code == 200
    event = AuditEvent.objects.last()
    assert client.post(f"/admin/pool/auditevent/{event.pk}/delete/", {"post": "yes"}).status_code == 403
