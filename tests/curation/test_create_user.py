"""manage.py create_user: users with a role (reviewer, operator, admin) as Django groups."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import CommandError, call_command

from curation.services.users import roles_ensure

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


def create(monkeypatch, username: str, role: str, password: str | None = PASSWORD) -> None:
    if password is None:
        monkeypatch.delenv("CLAW_USER_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("CLAW_USER_PASSWORD", password)
    call_command("create_user", "--username", username, "--role", role, "--noinput")


def test_each_role_gets_exactly_its_permissions(monkeypatch):
    # when: one user of each role is created
    for name, role in (("rita", "reviewer"), ("otto", "operator"), ("ada", "admin")):
        create(monkeypatch, name, role)
    User = get_user_model()
    rita, otto, ada = (User.objects.get(username=n) for n in ("rita", "otto", "ada"))
    # then: a reviewer views and gives feedback, and is not staff
    assert rita.check_password(PASSWORD) and not rita.is_staff and not rita.is_superuser
    assert rita.has_perm("pool.view_step") and rita.has_perm("pool.add_feedback")
    assert not rita.has_perm("pool.change_step") and not rita.has_perm("pool.delete_step")
    # and an operator curates (and reaches the admin), but deletes nothing
    assert otto.is_staff and otto.has_perm("pool.change_step") and otto.has_perm("pool.change_trajectory")
    assert not otto.has_perm("pool.delete_step") and not otto.has_perm("pool.add_apikey")
    # and an admin may do everything
    assert ada.is_superuser and ada.has_perm("pool.delete_step")
    assert [g.name for g in rita.groups.all()] == ["reviewer"] and [g.name for g in otto.groups.all()] == [
        "operator"
    ]


def test_roles_ensure_is_idempotent():
    first = roles_ensure()
    again = roles_ensure()
    assert {r: g.id for r, g in first.items()} == {r: g.id for r, g in again.items()}
    assert Group.objects.count() == 2
    assert set(again["reviewer"].permissions.values_list("codename", flat=True)) < set(
        again["operator"].permissions.values_list("codename", flat=True)
    )


@pytest.mark.parametrize(
    ("password", "message"),
    [(None, "CLAW_USER_PASSWORD"), ("short", "too short"), ("1234567890123", "entirely numeric")],
)
def test_noinput_needs_an_acceptable_password(monkeypatch, password, message):
    with pytest.raises(CommandError, match=message):
        create(monkeypatch, "nobody", "reviewer", password)
    assert not get_user_model().objects.filter(username="nobody").exists()


def test_an_existing_username_or_a_bad_role_is_refused(monkeypatch):
    create(monkeypatch, "rita", "reviewer")
    with pytest.raises(CommandError, match="already exists"):
        create(monkeypatch, "rita", "operator")
    with pytest.raises(CommandError, match="invalid choice"):
        create(monkeypatch, "root", "superhero")
    assert get_user_model().objects.get(username="rita").groups.get().name == "reviewer"


def test_interactive_passwords_must_match(monkeypatch):
    # given: a person typing two different passwords at the prompts
    answers = iter([PASSWORD, PASSWORD + "!"])
    monkeypatch.setattr("getpass.getpass", lambda prompt="": next(answers))
    # then: nothing is created
    with pytest.raises(CommandError, match="differ"):
        call_command("create_user", "--username", "ivy", "--role", "reviewer")
    assert not get_user_model().objects.filter(username="ivy").exists()
