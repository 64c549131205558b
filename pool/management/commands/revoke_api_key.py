"""python manage.py revoke_api_key PREFIX : the key stops working (idempotent)."""

from django.core.management.base import BaseCommand, CommandError

from pool.errors import PoolError
from pool.services.api_keys import api_key_revoke


class Command(BaseCommand):
    help = "Revoke an API key by its prefix (claw_<prefix>_...). Revoking twice is harmless."

    def add_arguments(self, parser):
        parser.add_argument("prefix", help="the key's prefix: claw_<prefix>_...")

    def handle(self, *args, prefix, **options):
        try:
            key = api_key_revoke(prefix=prefix, actor="cli")
        except PoolError as exc:
            raise CommandError(f"{exc.field}: {exc.message}") from exc
        self.stderr.write(f"key {key.prefix} revoked at {key.revoked_at.isoformat()}")
