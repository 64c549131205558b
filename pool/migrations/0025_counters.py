"""The pool's counters (pool.models.Counter): kept by statement-level triggers on PostgreSQL
(pool/migrations/_counters.py), counted from the rows as they are when this runs. No-op on
SQLite, where the readers count.

What each counts (the readers in pool/selectors/counters.py name them):

* steps (pool-wide): all; exact ids (client, upstream); retokenized; awaiting a final reward
  (readiness without REWARD_FINAL); drift; ready (readiness READY); labelled; their tokens
  (seq_len) and stored token bytes (seq_delta);
* trajectories (per source): all, by status, their steps (step_count) and the latest
  ``updated_at`` (microseconds since the epoch);
* prompt groups: all, by status, ready (ready_at set);
* merges: done merges' tokens and unique tokens, and those of groups (merged_groups);
* events and feedback: all;
* steps per minute of ``created_at`` (all, with drift), the last hours only.
"""

from django.db import migrations, models

from ._counters import Counted, Keyed, install, uninstall

TABLES = [
    Counted(
        "pool_step",
        (
            "token_source",
            "readiness",
            "drift",
            "label",
            "seq_len",
            "octet_length(seq_delta) AS delta_bytes",
            "created_at",
        ),
        (
            ("steps", "count", "TRUE"),
            ("exact", "count", "r.token_source IN ('client', 'upstream')"),
            ("retokenized", "count", "r.token_source = 'retokenized'"),
            ("awaiting_reward", "count", "r.readiness <= 15 AND (r.readiness & 2) = 0"),
            ("drift", "count", "r.drift"),
            ("ready", "count", "r.readiness = 15"),
            ("labelled", "count", "r.label <> ''"),
            ("tokens", "sum", "r.seq_len"),
            ("stored_bytes", "sum", "r.delta_bytes"),
        ),
        # The last hours' steps per minute (the key: minutes since the epoch), for the
        # overview's ingest rate and quality window, whose cost then no longer grows with the
        # ingest rate; the fold drops minutes past pool.services.counters.MINUTES_KEPT.
        also=(
            Keyed(
                "floor(extract(epoch FROM r.created_at) / 60)::bigint",
                (("minute:steps", "count", "TRUE"), ("minute:drift", "count", "r.drift")),
                since="created_at >= now() - interval '3 hours'",
            ),
        ),
    ),
    Counted(
        "pool_trajectory",
        ("source_id", "status", "step_count", "updated_at"),
        (
            ("trajectories", "count", "TRUE"),
            ("traj:running", "count", "r.status = 'running'"),
            ("traj:completed", "count", "r.status = 'completed'"),
            ("traj:failed", "count", "r.status = 'failed'"),
            ("traj:abandoned", "count", "r.status = 'abandoned'"),
            ("traj_steps", "sum", "r.step_count"),
            ("max:last_seen", "max", "(extract(epoch FROM r.updated_at) * 1000000)::bigint"),
        ),
        key="r.source_id",
    ),
    Counted(
        "pool_promptgroup",
        ("status", "ready_at"),
        (
            ("groups", "count", "TRUE"),
            ("group:open", "count", "r.status = 'open'"),
            ("group:complete", "count", "r.status = 'complete'"),
            ("ready_groups", "count", "r.ready_at IS NOT NULL"),
        ),
    ),
    Counted(
        "pool_mergeresult",
        ("status", "group_id", "total_tokens", "unique_tokens"),
        (
            ("merge:done_total", "sum", "CASE WHEN r.status = 'done' THEN r.total_tokens ELSE 0 END"),
            ("merge:done_unique", "sum", "CASE WHEN r.status = 'done' THEN r.unique_tokens ELSE 0 END"),
            ("merged_groups", "count", "r.status = 'done' AND r.group_id IS NOT NULL"),
            (
                "merge:group_total",
                "sum",
                "CASE WHEN r.status = 'done' AND r.group_id IS NOT NULL THEN r.total_tokens ELSE 0 END",
            ),
            (
                "merge:group_unique",
                "sum",
                "CASE WHEN r.status = 'done' AND r.group_id IS NOT NULL THEN r.unique_tokens ELSE 0 END",
            ),
        ),
    ),
    Counted("pool_event", ("id",), (("events", "count", "TRUE"),)),
    Counted("pool_feedback", ("id",), (("feedback", "count", "TRUE"),)),
]


def forwards(apps, schema_editor):
    install(schema_editor, TABLES)


def backwards(apps, schema_editor):
    uninstall(schema_editor, TABLES)


class Migration(migrations.Migration):
    dependencies = [("pool", "0024_toast_lz4")]

    operations = [
        migrations.CreateModel(
            name="Counter",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=32)),
                ("key", models.BigIntegerField(blank=True, null=True)),
                ("value", models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(forwards, backwards),
    ]
