"""Leases join the pool's counters (pool/migrations/_counters.py): open (leased) and acked
leases, kept by PostgreSQL triggers. No-op on SQLite."""

from django.db import migrations

from pool.migrations._counters import Counted, install, uninstall

TABLES = [
    Counted(
        "curation_lease",
        ("status",),
        (
            ("lease:leased", "count", "r.status = 'leased'"),
            ("lease:acked", "count", "r.status = 'acked'"),
        ),
    )
]


def forwards(apps, schema_editor):
    install(schema_editor, TABLES)


def backwards(apps, schema_editor):
    uninstall(schema_editor, TABLES)


class Migration(migrations.Migration):
    dependencies = [("curation", "0012_lease_body_lz4"), ("pool", "0025_counters")]

    operations = [migrations.RunPython(forwards, backwards)]
