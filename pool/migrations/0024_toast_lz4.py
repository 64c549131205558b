"""PostgreSQL: how the large columns are stored out of line (TOAST). No-op elsewhere.

* ``token_rewards`` (float64 per token) and a merge's ``layout`` (compressed already) are
  high-entropy: STORAGE EXTERNAL, like ``seq_delta`` and ``rollout_logprobs`` (0002), skips
  a pglz attempt that burns CPU on every insert and saves nothing.
* The texts (a step's ``messages``, ``response_text`` and ``metadata``, a remembered
  upstream text) compress well but pglz is slow: lz4 (PostgreSQL 14+, when the server is
  built with it) compresses a 190 kB JSON value in ~1.4 ms where pglz takes ~7.7 ms, for
  ~20% more bytes. Only values written after this migration use lz4; older ones stay
  readable as they are.
"""

from django.db import migrations

EXTERNAL = (("pool_step", "token_rewards"), ("pool_mergeresult", "layout"))
LZ4 = (
    ("pool_step", "messages"),
    ("pool_step", "response_text"),
    ("pool_step", "metadata"),
    ("pool_generationtext", "text"),
)


def lz4_available(schema_editor) -> bool:
    with schema_editor.connection.cursor() as cur:
        cur.execute(
            "SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY(enumvals)"
        )
        return cur.fetchone() is not None


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, col in EXTERNAL:
        schema_editor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{col}" SET STORAGE EXTERNAL')
    if lz4_available(schema_editor):
        for table, col in LZ4:
            schema_editor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{col}" SET COMPRESSION lz4')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table, col in EXTERNAL:
        schema_editor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{col}" SET STORAGE EXTENDED')
    for table, col in LZ4:
        schema_editor.execute(f'ALTER TABLE "{table}" ALTER COLUMN "{col}" SET COMPRESSION DEFAULT')


class Migration(migrations.Migration):
    dependencies = [("pool", "0023_growth")]

    operations = [migrations.RunPython(forwards, backwards)]
