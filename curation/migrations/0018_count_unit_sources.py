"""Each kept unit's data source (curation/services/counts.py: a reader restricted to some
sources sums its sources' shares). The units counted before do not know theirs: every count is
marked unbuilt, so the next read or sweep counts it again whole, sources included."""

from django.db import migrations, models


def counts_unbuilt(apps, schema_editor):
    apps.get_model("curation", "DatasetCount").objects.update(built=False)


class Migration(migrations.Migration):
    dependencies = [
        ("curation", "0017_delivery_unit"),
    ]

    operations = [
        migrations.AddField(
            model_name="datasetcountunit",
            name="one_source",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="datasetcountunit",
            name="source_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(counts_unbuilt, migrations.RunPython.noop),
    ]
