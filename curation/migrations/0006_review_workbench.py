"""The review workbench: per-queue guidelines (Markdown), group mode and its human rewards,
several labels per feedback, and several reviews per item. A claim gets a slot (0 for every
existing claim, so the lock stays what it was: one reviewer per item when
``reviews_per_item`` is 1) and, in group mode, the group it is for."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('curation', '0005_owners_and_reversible_drops'),
        ('pool', '0014_idempotent_calls'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='reviewclaim',
            name='reviewclaim_queue_traj_uniq',
        ),
        migrations.AddField(
            model_name='reviewclaim',
            name='group',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='pool.promptgroup'),
        ),
        migrations.AddField(
            model_name='reviewclaim',
            name='slot',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='reviewqueue',
            name='group_reward',
            field=models.CharField(choices=[('none', 'feedback only'), ('best', 'best rollout 1, the others 0'), ('rank', 'rank r of n: (n - r) / (n - 1)')], default='none', max_length=8),
        ),
        migrations.AddField(
            model_name='reviewqueue',
            name='guidelines',
            field=models.TextField(blank=True, default=''),
        ),
        migrations.AddField(
            model_name='reviewqueue',
            name='label_multi',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='reviewqueue',
            name='mode',
            field=models.CharField(choices=[('trajectory', 'one trajectory per item'), ('group', "a prompt group's rollouts side by side")], default='trajectory', max_length=12),
        ),
        migrations.AddField(
            model_name='reviewqueue',
            name='reviews_per_item',
            field=models.PositiveSmallIntegerField(default=1),
        ),
        migrations.AddIndex(
            model_name='reviewclaim',
            index=models.Index(condition=models.Q(('group__isnull', False)), fields=['group'], name='reviewclaim_group'),
        ),
        migrations.AddConstraint(
            model_name='reviewclaim',
            constraint=models.UniqueConstraint(fields=('queue', 'trajectory', 'slot'), name='reviewclaim_queue_traj_slot_uniq'),
        ),
        migrations.AddConstraint(
            model_name='reviewqueue',
            constraint=models.CheckConstraint(condition=models.Q(('reviews_per_item__gte', 1)), name='reviewqueue_reviews_per_item'),
        ),
    ]
