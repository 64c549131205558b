"""Whose rows a snapshot holds (Snapshot.source_ids, pool/tenancy.py): the source ids of its
steps' trajectories, recorded when a build is done. Backfilled here for the snapshots done
before it, from their frozen step ids; a snapshot not done yet records them when its build
ends."""

from django.db import migrations, models

CHUNK = 1000


def backfill(apps, schema_editor):
    """Each done snapshot's source ids, read CHUNK frozen step ids at a time."""
    Snapshot = apps.get_model("curation", "Snapshot")
    Step = apps.get_model("pool", "Step")
    done = Snapshot.objects.filter(status="done", source_ids__isnull=True).values_list("id", flat=True)
    for snapshot_id in list(done):
        step_ids = Snapshot.objects.filter(id=snapshot_id).values_list("step_ids", flat=True).first() or []
        sources: set = set()
        for start in range(0, len(step_ids), CHUNK):
            chunk = step_ids[start : start + CHUNK]
            sources |= set(
                Step.objects.filter(id__in=chunk).values_list("trajectory__source_id", flat=True).distinct()
            )
        ordered = sorted(sources, key=lambda i: (i is None, i or 0))
        Snapshot.objects.filter(id=snapshot_id).update(source_ids=ordered)


class Migration(migrations.Migration):
    dependencies = [
        ("curation", "0007_serving_order"),
        ("pool", "0012_tenancy"),
    ]

    operations = [
        migrations.AddField(
            model_name="snapshot",
            name="source_ids",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
