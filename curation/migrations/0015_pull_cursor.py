"""Pull cursors (curation/services/cursors.py): where a consumer's oldest-first pull of a
dataset reads each ready queue from, so a pull's cost does not grow with what it has taken."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("curation", "0014_lease_batch_dropped"),
    ]

    operations = [
        migrations.CreateModel(
            name="PullCursor",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "kind",
                    models.PositiveSmallIntegerField(choices=[(1, "group"), (2, "trajectory"), (3, "step")]),
                ),
                ("policy_version", models.PositiveBigIntegerField(blank=True, null=True)),
                ("at", models.DateTimeField(blank=True, null=True)),
                ("key", models.BigIntegerField(default=0)),
                ("epoch", models.PositiveBigIntegerField(default=0)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "consumer",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="curation.consumer",
                    ),
                ),
                (
                    "dataset",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="curation.dataset",
                    ),
                ),
                (
                    "dataset_version",
                    models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="curation.datasetversion",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("consumer", "dataset", "kind"), name="pullcursor_one")
                ],
            },
        ),
    ]
