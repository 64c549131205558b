"""Consumers get an owner (the source of the key that created them; existing ones have none:
admin keys and operators only), and drops remember the current policy version they were
made under, so a stale drop is looked at again once the current version has moved back.

Existing stale and filtered drops did not record it: they get the highest policy version
known, the most any of them could have been made under, so they hold while the current
version is there and are looked at again (once) if it is ever below it."""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Max


def backfill(apps, schema_editor):
    Skip = apps.get_model("curation", "Skip")
    PolicyVersion = apps.get_model("pool", "PolicyVersion")
    highest = PolicyVersion.objects.aggregate(v=Max("version"))["v"]
    if highest is not None:
        # reasons 1 (filtered) and 2 (stale): Skip.Reason
        Skip.objects.filter(reason__in=[1, 2], policy_version__isnull=True).update(policy_version=highest)


class Migration(migrations.Migration):
    dependencies = [
        ("curation", "0004_skip_reason"),
        ("pool", "0011_effective_reward"),
    ]

    operations = [
        migrations.AddField(
            model_name="consumer",
            name="source",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="pool.source",
            ),
        ),
        migrations.AddField(
            model_name="skip",
            name="policy_version",
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
