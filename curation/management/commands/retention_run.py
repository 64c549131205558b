"""``manage.py retention_run [--policy NAME] [--dry-run]``: apply the enabled retention
policies (or one, enabled or not) now, as celery beat does every CLAW_RETENTION_SECONDS;
without ``--policy``, the leases' batches past their replay window first (leases_trim) and,
last, the leases holding no delivery past it (leases_forget_undelivered), as the sweep does.
``--dry-run`` says what would go and removes nothing."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...models import RetentionPolicy
from ...services.retention import Report, leases_forget_undelivered, leases_trim, retention_run


class Command(BaseCommand):
    help = "Apply the retention policies: archive and remove what they select (docs/operations.md)."

    def add_arguments(self, parser):
        parser.add_argument("--policy", help="only this policy (by name), even if disabled")
        parser.add_argument("--dry-run", action="store_true", help="count what would go; remove nothing")

    def handle(self, *args: Any, policy: str | None, dry_run: bool, **options: Any) -> None:
        policies = RetentionPolicy.objects.order_by("name")
        policies = policies.filter(name=policy) if policy else policies.filter(enabled=True)
        if policy and not policies:
            raise CommandError(f"no retention policy named {policy!r}")

        def progress(r: Report) -> None:
            self.stderr.write(f"  {r.policy}: chunk {r.chunks}, {r.groups} groups, {r.steps} steps so far")

        if not policy and not dry_run:
            self.stderr.write(f"  leases past their replay window trimmed: {leases_trim()}")
        for p in policies:
            report = retention_run(policy=p, dry_run=dry_run, progress=progress)
            self.stdout.write(json.dumps(report.as_dict()))
        if not policy and not dry_run:
            self.stderr.write(f"  nacked or expired leases forgotten: {leases_forget_undelivered()}")
