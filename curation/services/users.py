"""Write services of curation: roles and the users who hold them."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.contrib.auth.password_validation import validate_password
from django.db import transaction

from pool.errors import Conflict, InvalidInput

from ..roles import ADMIN, PERMISSIONS, ROLES


@transaction.atomic
def roles_ensure() -> dict[str, Group]:
    """The reviewer and operator groups with exactly their permissions. Idempotent."""
    groups = {}
    for role, codenames in PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        perms = list(Permission.objects.filter(content_type__app_label="pool", codename__in=codenames))
        missing = set(codenames) - {p.codename for p in perms}
        if missing:
            raise RuntimeError(f"unknown pool permissions for {role}: {sorted(missing)} (migrate first)")
        group.permissions.set(perms)
        groups[role] = group
    return groups


@transaction.atomic
def user_create(*, username: str, role: str, password: str, email: str = "") -> AbstractBaseUser:
    """Create a user holding ``role``. Not idempotent: an existing username raises Conflict;
    a bad role or a password the validators refuse raises InvalidInput. Reviewers and
    operators are not staff: they sign in on the pages' own sign-in page, not the admin's
    (operators are staff, so they also reach the admin)."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {list(ROLES)}; got {role!r}", field="role")
    User = get_user_model()
    if User.objects.filter(username=username).exists():
        raise Conflict(f"user {username!r} already exists", field="username")
    user = User(username=username, email=email)
    try:
        validate_password(password, user)
    except Exception as exc:  # django.core.exceptions.ValidationError: its messages, joined
        raise InvalidInput(" ".join(getattr(exc, "messages", [str(exc)])), field="password") from None
    if role == ADMIN:
        return User.objects.create_superuser(username=username, email=email, password=password)
    user.set_password(password)
    user.is_staff = role != "reviewer"
    user.save()
    user.groups.add(roles_ensure()[role])
    return user
