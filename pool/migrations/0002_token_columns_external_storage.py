"""PostgreSQL: store token/logprob blobs uncompressed (STORAGE EXTERNAL).

Token ids and float logprobs are high-entropy: pglz compression fails on them after burning
CPU on every insert. EXTERNAL keeps out-of-line TOAST storage but skips the attempt.
No-op on other databases.
"""

from django.db import migrations

COLUMNS = ("seq_delta", "rollout_logprobs")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for col in COLUMNS:
        schema_editor.execute(f'ALTER TABLE "pool_step" ALTER COLUMN "{col}" SET STORAGE EXTERNAL')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for col in COLUMNS:
        schema_editor.execute(f'ALTER TABLE "pool_step" ALTER COLUMN "{col}" SET STORAGE EXTENDED')


class Migration(migrations.Migration):
    dependencies = [("pool", "0001_initial")]

    operations = [migrations.RunPython(forwards, backwards)]
