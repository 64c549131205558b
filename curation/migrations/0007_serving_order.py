"""Serving order and reuse (specs.Serving ``order``, ``priority``, ``reuse``): a Delivery
row records its use index (0 for every existing row: each was the one use a consumer had),
exactly once becomes once per (consumer, dataset, unit, use index), and ready groups get
their serving scores (GroupScore), backfilled here for the groups ready now (afterwards the
effect of GroupsReady writes them)."""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Count, Min, Q

CHUNK = 1000


def backfill(apps, schema_editor):
    """The scores of today's ready groups, as services.consume.group_scores_refresh computes
    them (population std of the completed rollouts' rewards, the trajectory's else its last
    step's; the lowest policy version of their steps, -1 if one has none)."""
    PromptGroup = apps.get_model("pool", "PromptGroup")
    Trajectory = apps.get_model("pool", "Trajectory")
    Step = apps.get_model("pool", "Step")
    GroupScore = apps.get_model("curation", "GroupScore")
    ready = list(
        PromptGroup.objects.filter(ready_at__isnull=False).order_by("id").values_list("id", "ready_at")
    )
    for i in range(0, len(ready), CHUNK):
        chunk = dict(ready[i : i + CHUNK])
        rewards = {g: {} for g in chunk}
        for tid, gid, reward in Trajectory.objects.filter(group_id__in=chunk, status="completed").values_list(
            "id", "group_id", "reward"
        ):
            rewards[gid][tid] = reward
        missing = [t for g in rewards.values() for t, r in g.items() if r is None]
        last = dict(
            Step.objects.filter(trajectory_id__in=missing, is_last=True).values_list(
                "trajectory_id", "reward"
            )
        )
        versions = {
            gid: -1 if none else lowest
            for gid, lowest, none in Step.objects.filter(
                trajectory__group_id__in=chunk, trajectory__status="completed"
            )
            .values_list("trajectory__group_id")
            .annotate(
                lowest=Min("policy_version_id"), none=Count("id", filter=Q(policy_version__isnull=True))
            )
            .values_list("trajectory__group_id", "lowest", "none")
            .order_by()
        }
        rows = []
        for gid, at in chunk.items():
            values = [
                v
                for v in (r if r is not None else last.get(t) for t, r in rewards[gid].items())
                if v is not None
            ]
            std = 0.0
            if len(values) > 1:
                mean = sum(values) / len(values)
                std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
            rows.append(
                GroupScore(group_id=gid, reward_std=std, policy_version=versions.get(gid, -1), ready_at=at)
            )
        GroupScore.objects.bulk_create(rows, ignore_conflicts=True)


class Migration(migrations.Migration):
    dependencies = [
        ("curation", "0006_review_workbench"),
        ("pool", "0014_idempotent_calls"),
    ]

    operations = [
        migrations.CreateModel(
            name="GroupScore",
            fields=[
                (
                    "group",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="serving_score",
                        serialize=False,
                        to="pool.promptgroup",
                    ),
                ),
                ("reward_std", models.FloatField()),
                ("policy_version", models.BigIntegerField()),
                ("ready_at", models.DateTimeField()),
            ],
        ),
        migrations.RemoveConstraint(
            model_name="delivery",
            name="delivery_once",
        ),
        migrations.AddField(
            model_name="delivery",
            name="use_index",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name="delivery",
            constraint=models.UniqueConstraint(
                fields=("consumer", "dataset", "kind", "key", "use_index"), name="delivery_use_once"
            ),
        ),
        migrations.AddIndex(
            model_name="groupscore",
            index=models.Index(fields=["-reward_std", "ready_at", "group"], name="gscore_spread"),
        ),
        migrations.AddIndex(
            model_name="groupscore",
            index=models.Index(fields=["-policy_version", "ready_at", "group"], name="gscore_fresh"),
        ),
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
