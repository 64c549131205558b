"""python manage.py create_api_key --name N --scope S [--scope S2] : prints the key once."""

from django.core.management.base import BaseCommand, CommandError

from pool.errors import PoolError
from pool.models import Scope, Source
from pool.services.api_keys import api_key_create


class Command(BaseCommand):
    help = "Create an API key for a source (created on first use). The key is printed once."

    def add_arguments(self, parser):
        parser.add_argument(
            "--name", required=True, help="key name; also the source name unless --source is given"
        )
        parser.add_argument(
            "--scope", action="append", required=True, choices=Scope.values, help="repeatable"
        )
        parser.add_argument("--source", default=None, help="source name (default: --name)")
        parser.add_argument("--kind", default=Source.Kind.AGENT, choices=Source.Kind.values)
        parser.add_argument(
            "--extra-source",
            action="append",
            default=[],
            dest="extra_sources",
            help="an existing source the key may also write and read as its own; repeatable",
        )

    def handle(self, *args, name, scope, source, kind, extra_sources, **options):
        try:
            key, clear = api_key_create(
                name=name,
                scopes=scope,
                source_name=source,
                source_kind=kind,
                extra_sources=extra_sources,
                actor="cli",
            )
        except PoolError as exc:
            raise CommandError(f"{exc.field}: {exc.message}") from exc
        self.stderr.write(f"created key {key.prefix} for source {key.source.name!r} with scopes {key.scopes}")
        self.stdout.write(clear)
