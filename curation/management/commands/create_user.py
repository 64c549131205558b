"""``manage.py create_user --username NAME --role reviewer|operator|admin``.

Asks for the password (twice), or with ``--noinput`` reads it from CLAW_USER_PASSWORD, as
createsuperuser does with DJANGO_SUPERUSER_PASSWORD.
"""

from __future__ import annotations

import getpass
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from pool.errors import PoolError

from ...roles import ROLES
from ...services.users import user_create


class Command(BaseCommand):
    help = "Create a user with a role: reviewer (view, give feedback), operator (curate) or admin."

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True)
        parser.add_argument("--role", required=True, choices=ROLES)
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--noinput", "--no-input", action="store_false", dest="interactive",
            help="do not prompt; the password comes from CLAW_USER_PASSWORD",
        )  # fmt: skip

    def handle(
        self, *args: Any, username: str, role: str, email: str, interactive: bool, **options: Any
    ) -> None:
        if interactive:
            password = getpass.getpass("Password: ")
            if password != getpass.getpass("Password (again): "):
                raise CommandError("the two passwords differ")
        else:
            password = os.environ.get("CLAW_USER_PASSWORD", "")
            if not password:
                raise CommandError("--noinput needs the password in CLAW_USER_PASSWORD")
        try:
            user_create(username=username, role=role, password=password, email=email)
        except PoolError as exc:
            raise CommandError(exc.message) from None
        self.stdout.write(f"created {role} {username!r}")
