"""``manage.py retention_run [--policy NAME] [--dry-run]``: without ``--policy``, the
retention sweep that celery beat runs every CLAW_RETENTION_SECONDS, now (``retention_sweep``:
leases' batches past their replay window trimmed, the enabled policies, the leases holding no
delivery forgotten); with it, that one policy's pass, enabled or not. ``--dry-run`` says what
the policies would remove and changes nothing. ``--duty`` paces the passes (default
CLAW_RETENTION_DUTY; 1 runs them unpaced). Each pass's report is a JSON line on stdout."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ...models import RetentionPolicy
from ...services.retention import Report, duty_check, retention_run, retention_sweep


class Command(BaseCommand):
    help = "Apply the retention policies: archive and remove what they select (docs/operations.md)."

    def add_arguments(self, parser):
        parser.add_argument("--policy", help="only this policy (by name), even if disabled")
        parser.add_argument("--dry-run", action="store_true", help="count what would go; remove nothing")
        parser.add_argument(
            "--duty",
            type=float,
            help="the share of its time a pass works, in (0, 1] (default CLAW_RETENTION_DUTY; 1: unpaced)",
        )

    def handle(
        self, *args: Any, policy: str | None, dry_run: bool, duty: float | None, **options: Any
    ) -> None:
        if duty is not None:
            try:
                duty_check(duty, name="--duty")
            except ValueError as e:
                raise CommandError(str(e)) from None
        policies = RetentionPolicy.objects.order_by("name")
        policies = policies.filter(name=policy) if policy else policies.filter(enabled=True)
        if policy and not policies:
            raise CommandError(f"no retention policy named {policy!r}")

        def progress(r: Report) -> None:
            self.stderr.write(f"  {r.policy}: chunk {r.chunks}, {r.groups} groups, {r.steps} steps so far")

        if policy or dry_run:
            for p in policies:
                report = retention_run(policy=p, dry_run=dry_run, progress=progress, duty=duty)
                self.stdout.write(json.dumps(report.as_dict()))
            return
        sweep = retention_sweep(progress=progress, duty=duty)
        for report in sweep.reports:
            self.stdout.write(json.dumps(report.as_dict()))
        self.stderr.write(f"  leases past their replay window trimmed: {sweep.trimmed_leases}")
        self.stderr.write(f"  nacked or expired leases forgotten: {sweep.forgotten_undelivered}")
