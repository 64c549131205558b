"""Management commands: create_api_key and the first-start bootstrap."""

from __future__ import annotations

import io
import re
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

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
    # then an operator superuser and an ingest and a trainer key exist and were printed
    op = User.objects.get(username="operator")
    assert op.is_superuser and op.is_staff and op.check_password("s3cret-operator")
    keys = KEY_RE.findall(out)
    assert len(keys) == 2
    assert set(ApiKey.objects.values_list("name", flat=True)) == {"default-ingest", "default-trainer"}
    # and the credentials file holds the same, readable by the owner only
    creds = settings.VAR_DIR / "first-run-credentials.txt"
    text = creds.read_text()
    assert "s3cret-operator" in text and all(k in text for k in keys)
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    # and the printed keys work: the ingest key writes, the trainer key reads
    ingest, trainer = keys
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
    assert User.objects.count() == 1 and ApiKey.objects.count() == 2
    assert creds.read_text() == text
    assert not KEY_RE.search(out2) and "s3cret-operator" not in out2
    assert "exist" in out2


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
