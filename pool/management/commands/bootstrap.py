"""First-start setup for `make run`: an operator account and an ingest API key.

Runs on every start and does nothing once done. The credentials are printed at first start
and also written to var/first-run-credentials.txt (mode 0600) so they can be found again.
"""

import os
import secrets
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from pool.models import ApiKey, Scope, Source
from pool.services import api_key_create


class Command(BaseCommand):
    help = "Create the operator account and an ingest API key on first start."

    def handle(self, *args, **options):
        creds = Path(settings.VAR_DIR) / "first-run-credentials.txt"
        User = get_user_model()
        lines = []
        with transaction.atomic():
            if not User.objects.filter(username="operator").exists():
                password = os.environ.get("CLAW_OPERATOR_PASSWORD") or secrets.token_urlsafe(12)
                User.objects.create_superuser("operator", "operator@localhost", password)
                lines.append(f"operator login:  operator / {password}")
            if not ApiKey.objects.filter(name="default-ingest").exists():
                _, key = api_key_create(
                    name="default-ingest",
                    scopes=[Scope.INGEST, Scope.READ],
                    source_name="default",
                    source_kind=Source.Kind.AGENT,
                )
                lines.append(f"ingest API key:  {key}")
                _, key = api_key_create(
                    name="default-trainer",
                    scopes=[Scope.CONSUME, Scope.POLICY, Scope.READ],
                    source_name="trainer",
                    source_kind=Source.Kind.TRAINER,
                )
                lines.append(f"trainer API key: {key}")
        if lines:
            creds.parent.mkdir(parents=True, exist_ok=True)
            creds.write_text("\n".join(lines) + "\n")
            os.chmod(creds, 0o600)
            self.stdout.write(
                "\n" + "=" * 72 + "\nFirst start: save these, they are shown once.\n" + "\n".join(lines)
            )
            self.stdout.write(
                f"(also written to {creds.relative_to(settings.BASE_DIR) if creds.is_relative_to(settings.BASE_DIR) else creds})\n"
                + "=" * 72
            )
        else:
            self.stdout.write(f"Operator and keys exist; first-start credentials are in {creds}")
