"""A step's uid keeps its unique index and loses the second index Django gives a unique
text column on PostgreSQL (``varchar_pattern_ops``, for ``LIKE 'prefix%'``). Nothing asks a
step's uid by prefix (the admin's search is ``icontains``, which no b-tree serves), and every
step insert and every non-HOT update of a step (each reward and readiness write) paid for
one more index entry of a 30-160 byte key. The uniqueness moves from the field to a
constraint of the same name (pool_step_uid_key, PostgreSQL's name for the column's UNIQUE), so
the database keeps its unique index as it is; only the pattern index is dropped.
"""

from django.db import migrations, models


def _like_index(schema_editor) -> str:
    return schema_editor._create_index_name("pool_step", ["uid"], suffix="_like")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{_like_index(schema_editor)}"')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{_like_index(schema_editor)}" ON "pool_step" ("uid" varchar_pattern_ops)'
        )


class Migration(migrations.Migration):
    dependencies = [("pool", "0025_counters")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="step", name="uid", field=models.CharField(max_length=160)),
                migrations.AddConstraint(
                    model_name="step",
                    constraint=models.UniqueConstraint(fields=["uid"], name="pool_step_uid_key"),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        )
    ]
