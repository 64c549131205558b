from django.db import migrations, models
from django.db.models import Q
from django.utils import timezone

CHUNK = 5000


def stamp_delivered(apps, schema_editor):
    """Trajectories already leased (curation Delivery rows) or frozen into a snapshot are
    stamped delivered now, so their rewards are frozen like those delivered from here on."""
    Trajectory = apps.get_model("pool", "Trajectory")
    Step = apps.get_model("pool", "Step")
    Delivery = apps.get_model("curation", "Delivery")
    Snapshot = apps.get_model("curation", "Snapshot")
    now = timezone.now()
    # Delivery.kind: 1 group (key: its id), 2 trajectory, 3 step.
    for kind, of in ((1, "group_id"), (2, "id")):
        keys = Delivery.objects.filter(kind=kind).values("key")
        Trajectory.objects.filter(**{f"{of}__in": keys}, delivered_at__isnull=True).update(delivered_at=now)
    step_keys = Delivery.objects.filter(kind=3).values("key")
    Trajectory.objects.filter(
        Q(id__in=Step.objects.filter(id__in=step_keys).values("trajectory_id")), delivered_at__isnull=True
    ).update(delivered_at=now)
    for snap in Snapshot.objects.exclude(step_ids=None).only("step_ids").iterator():
        ids = snap.step_ids or []
        for i in range(0, len(ids), CHUNK):
            of_steps = Step.objects.filter(id__in=ids[i : i + CHUNK]).values("trajectory_id")
            Trajectory.objects.filter(id__in=of_steps, delivered_at__isnull=True).update(delivered_at=now)


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0019_media_sources"),
        ("curation", "0007_serving_order"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectory",
            name="delivered_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(stamp_delivered, migrations.RunPython.noop),
    ]
