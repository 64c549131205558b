"""python manage.py rotate_api_key PREFIX : revokes the key and prints its replacement once."""

from django.core.management.base import BaseCommand, CommandError

from pool.errors import PoolError
from pool.services.api_keys import api_key_rotate


class Command(BaseCommand):
    help = (
        "Replace a key by a new one (same name, source, scopes) and revoke it. The new key is printed once."
    )

    def add_arguments(self, parser):
        parser.add_argument("prefix", help="the key's prefix: claw_<prefix>_...")

    def handle(self, *args, prefix, **options):
        try:
            key, clear = api_key_rotate(prefix=prefix, actor="cli")
        except PoolError as exc:
            raise CommandError(f"{exc.field}: {exc.message}") from exc
        self.stderr.write(f"revoked key {prefix}; new key {key.prefix} with scopes {key.scopes}")
        self.stdout.write(clear)
