"""A lease's served batch is dropped past its replay window (curation/services/retention.py,
leases_trim): when it was, and the partial index the sweep reads the leases still holding
theirs by, oldest first."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("curation", "0013_lease_counters")]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="batch_dropped_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="lease",
            index=models.Index(
                condition=models.Q(("batch_dropped_at__isnull", True)),
                fields=["created_at"],
                name="lease_batch_kept",
            ),
        ),
    ]
