"""First-start setup for `make run`: an operator account, an ingest key, an admin key and a
trainer key.

Runs on every start and does nothing once done. The operator's password and the ingest key
are printed at first start and also written to var/first-run-credentials.txt (mode 0600).
The admin key (scope admin) and the trainer key (consume + policy + read) are kept like the
demo agents' key (claw_site/management/commands/serve.py): each clear key in its own file
under VAR_DIR (admin.key, trainer.key; mode 0600), reused while it is valid, a new one minted
(and printed) when the file is missing or its key revoked. Every start prints the `export`
line that loads them into a shell for the README's examples.
"""

import os
import secrets
import shlex
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction

from pool.models import ApiKey, Scope, Source
from pool.services.api_keys import api_key_create, api_key_verify

# (environment variable, key name, file under VAR_DIR, scopes, source, source kind)
STORED_KEYS = (
    ("ADMIN_KEY", "default-admin", "admin.key", [Scope.ADMIN], "admin", Source.Kind.OPERATOR),
    (
        "TRAINER_KEY",
        "default-trainer",
        "trainer.key",
        [Scope.CONSUME, Scope.POLICY, Scope.READ],
        "trainer",
        Source.Kind.TRAINER,
    ),
)


def stored_key(
    *, name: str, filename: str, scopes: list[str], source_name: str, source_kind: str = Source.Kind.AGENT
) -> tuple[str, bool]:
    """The clear key kept in VAR_DIR/``filename`` while it is still valid, else a newly created
    one (``name``, ``scopes``, ``source_name``) written there with mode 0600. Returns (clear
    key, whether it was created now)."""
    path = Path(settings.VAR_DIR) / filename
    if path.exists():
        clear = path.read_text().strip()
        if clear and api_key_verify(clear) is not None:
            return clear, False
    _, clear = api_key_create(name=name, scopes=scopes, source_name=source_name, source_kind=source_kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(clear + "\n")
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_CREAT
    return clear, True


def _shown(path: Path) -> str:
    return str(path.relative_to(settings.BASE_DIR) if path.is_relative_to(settings.BASE_DIR) else path)


class Command(BaseCommand):
    help = "Create the operator account, an ingest key, an admin key and a trainer key on first start."

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
                # ingest alone: an agent reads back its own source's rows (pool/tenancy.py);
                # ``read`` would read every source's.
                _, key = api_key_create(
                    name="default-ingest",
                    scopes=[Scope.INGEST],
                    source_name="default",
                    source_kind=Source.Kind.AGENT,
                )
                lines.append(f"ingest API key:  {key}")
        if lines:
            creds.parent.mkdir(parents=True, exist_ok=True)
            creds.write_text("\n".join(lines) + "\n")
            os.chmod(creds, 0o600)
            self.stdout.write(
                "\n" + "=" * 72 + "\nFirst start: save these, they are shown once.\n" + "\n".join(lines)
            )
            self.stdout.write(f"(also written to {_shown(creds)})\n" + "=" * 72)
        else:
            self.stdout.write(f"Operator and keys exist; first-start credentials are in {_shown(creds)}")
        created, from_files = [], []
        for env, name, filename, scopes, source, kind in STORED_KEYS:
            with transaction.atomic():
                clear, new = stored_key(
                    name=name, filename=filename, scopes=scopes, source_name=source, source_kind=kind
                )
            path = shlex.quote(_shown(Path(settings.VAR_DIR) / filename))
            from_files.append(f"{env}=$(cat {path})")
            if new:
                created.append(f"{env}={clear}")
        if created:
            self.stdout.write(
                "New keys for the README's examples (admin: curation; trainer: consume + policy), "
                "also kept in admin.key and trainer.key under the var dir:\n  export " + " ".join(created)
            )
        self.stdout.write("Load the admin and trainer keys into a shell:\n  export " + " ".join(from_files))
