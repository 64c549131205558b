"""Management commands: create_api_key and the first-start bootstrap."""

from __future__ import annotations

import io
import re
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from pool.models import ApiKey, Source, Step
from tests.conftest import client_for, make_step

pytestmark = pytest.mark.django_db

KEY_RE = re.compile(r"claw_[0-9a-f]{12}_[A-Za-z0-9_-]{40,}")


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


# --- create_api_key ----------------------------------------------------------------------------
def test_create_api_key_prints_only_the_key_once():
    # when a key is created with two scopes
    out, err = run("create_api_key", "--name", "runner-1", "--scope", "ingest", "--scope", "read")
    # then stdout holds exactly the key (scripts can capture it), details go to stderr
    key = out.strip()
    assert KEY_RE.fullmatch(key), out
    assert out == key + "\n"
    assert "runner-1" in err and key not in err
    row = ApiKey.objects.get()
    assert row.scopes == ["ingest", "read"] and row.source.name == "runner-1"
    assert key not in row.key_hash
    # and the key works for its scopes only
    client = client_for(key)
    assert (
        client.post(
            "/api/v1/steps", {"steps": [make_step("k", 0, prompt=[1, 2], response=[3])]}, format="json"
        ).status_code
        == 201
    )
    assert Step.objects.get().source.name == "runner-1"


def test_create_api_key_with_source_and_kind():
    out, _ = run(
        "create_api_key",
        "--name",
        "trainer-key",
        "--scope",
        "consume",
        "--source",
        "trainer-a",
        "--kind",
        "trainer",
    )
    row = ApiKey.objects.select_related("source").get()
    assert (row.name, row.source.name, row.source.kind) == ("trainer-key", "trainer-a", Source.Kind.TRAINER)
    # a consume key may read but not write
    client = client_for(out.strip())
    assert client.get("/api/v1/steps").status_code == 200
    assert client.post("/api/v1/events", {"type": "x"}, format="json").status_code == 403


def test_each_call_mints_a_new_key():
    a, _ = run("create_api_key", "--name", "same", "--scope", "read")
    b, _ = run("create_api_key", "--name", "same", "--scope", "read")
    assert a != b and ApiKey.objects.count() == 2 and Source.objects.count() == 1


@pytest.mark.parametrize(
    "args",
    [
        ["--name", "x", "--scope", "root"],
        ["--name", "x"],
        ["--scope", "read"],
        ["--name", "x", "--scope", "read", "--kind", "robot"],
    ],
    ids=["bad-scope", "no-scope", "no-name", "bad-kind"],
)
def test_create_api_key_bad_arguments(args):
    # when the command is called with a bad scope or a missing argument
    with pytest.raises(CommandError):
        run("create_api_key", *args)
    # then no key or source was created
    assert ApiKey.objects.count() == 0 and Source.objects.count() == 0


# --- bootstrap ---------------------------------------------------------------------------------
def test_bootstrap_creates_operator_and_keys_once(settings, tmp_path, monkeypatch):
    # given an empty var dir and a chosen operator password
    settings.VAR_DIR = tmp_path / "var"
    monkeypatch.setenv("CLAW_OPERATOR_PASSWORD", "s3cret-operator")
    User = get_user_model()
    # when bootstrap runs the first time
    out, _ = run("bootstrap")
    # then an operator superuser and an ingest, an admin and a trainer key exist and were printed
    op = User.objects.get(username="operator")
    assert op.is_superuser and op.is_staff and op.check_password("s3cret-operator")
    keys = list(dict.fromkeys(KEY_RE.findall(out)))
    assert len(keys) == 3
    assert set(ApiKey.objects.values_list("name", flat=True)) == {
        "default-ingest",
        "default-admin",
        "default-trainer",
    }
    # and the credentials file holds the operator and the ingest key, readable by the owner only
    creds = settings.VAR_DIR / "first-run-credentials.txt"
    text = creds.read_text()
    ingest, admin, trainer = keys
    assert "s3cret-operator" in text and ingest in text
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    # and the admin and trainer keys are printed as a line to paste, and kept in their files
    assert f"export ADMIN_KEY={admin} TRAINER_KEY={trainer}" in out
    for name, clear in (("admin.key", admin), ("trainer.key", trainer)):
        path = settings.VAR_DIR / name
        assert path.read_text().strip() == clear and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(ApiKey.objects.get(name="default-trainer").scopes) == {"consume", "policy", "read"}
    assert ApiKey.objects.get(name="default-admin").scopes == ["admin"]
    # the ingest key is an agent's: ingest alone, reading its own source only (pool/tenancy.py)
    assert ApiKey.objects.get(name="default-ingest").scopes == ["ingest"]
    # and the printed keys work: the ingest key writes, the trainer key reads, the admin key
    # reads the stats
    assert client_for(admin).get("/api/v1/stats").status_code == 200
    assert (
        client_for(ingest)
        .post("/api/v1/steps", {"steps": [make_step("b", 0, prompt=[1], response=[2])]}, format="json")
        .status_code
        == 201
    )
    assert client_for(trainer).get("/api/v1/steps").status_code == 200

    # when bootstrap runs again
    out2, _ = run("bootstrap")
    # then it is a no-op: no new user or key, the file unchanged, no secret printed
    assert User.objects.count() == 1 and ApiKey.objects.count() == 3
    assert creds.read_text() == text
    assert not KEY_RE.search(out2) and "s3cret-operator" not in out2
    assert "exist" in out2
    # but the line that loads the stored admin and trainer keys into a shell
    admin_file, trainer_file = settings.VAR_DIR / "admin.key", settings.VAR_DIR / "trainer.key"
    assert f"export ADMIN_KEY=$(cat {admin_file}) TRAINER_KEY=$(cat {trainer_file})" in out2


@pytest.mark.parametrize(
    "damage",
    ["missing", "revoked", "garbage"],
)
def test_bootstrap_replaces_a_stored_key_that_is_no_longer_valid(settings, tmp_path, damage):
    # given a bootstrapped var dir whose admin key file is then lost, revoked or overwritten
    settings.VAR_DIR = tmp_path
    run("bootstrap")
    path = tmp_path / "admin.key"
    old = path.read_text().strip()
    if damage == "missing":
        path.unlink()
    elif damage == "revoked":
        ApiKey.objects.filter(name="default-admin").update(revoked_at=timezone.now())
    else:
        path.write_text("claw_000000000000_not-a-key\n")
    trainer = (tmp_path / "trainer.key").read_text()
    # when bootstrap runs again
    out, _ = run("bootstrap")
    # then a new admin key is printed, stored (mode 0600) and works; the trainer key is kept
    new = path.read_text().strip()
    assert new != old and f"export ADMIN_KEY={new}" in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert client_for(new).get("/api/v1/stats").status_code == 200
    assert (tmp_path / "trainer.key").read_text() == trainer and "TRAINER_KEY=claw_" not in out


def test_bootstrap_generates_a_password_when_none_is_given(settings, tmp_path, monkeypatch):
    # given no operator password in the environment
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("CLAW_OPERATOR_PASSWORD", raising=False)
    # when bootstrap runs
    out, _ = run("bootstrap")
    # then the printed password signs the operator in
    password = re.search(r"operator / (\S+)", out).group(1)
    assert len(password) >= 12
    assert get_user_model().objects.get(username="operator").check_password(password)
