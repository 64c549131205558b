"""``manage.py archive_restore ARCHIVE_ID``: bring an archive's groups back into the pool
(curation/services/retention.py archive_restore). Idempotent: what is already there stays."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...models import Archive
from ...services.retention import ArchiveError, archive_restore


class Command(BaseCommand):
    help = "Restore a retention archive into the pool (its files' sha256 checked first)."

    def add_arguments(self, parser):
        parser.add_argument(
            "archive", help="the archive's id (the admin's Archives list, or a pass's report)"
        )

    def handle(self, *args: Any, archive: str, **options: Any) -> None:
        try:
            found = Archive.objects.get(id=uuid.UUID(archive))
        except (ValueError, Archive.DoesNotExist):
            raise CommandError(f"no archive {archive!r}") from None
        try:
            counts = archive_restore(archive=found)
        except ArchiveError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(json.dumps({"archive": archive, **counts}))
