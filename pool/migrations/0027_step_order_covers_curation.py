"""One index where a step had two on the same leading column: the step order's unique key
(trajectory, step_index) now also covers the curation columns (pool.models.steps.
CURATION_COLUMNS), and the covering index step_curation (trajectory) is dropped. Previews
and admission read the same narrow entries (an index-only scan in trajectory order), and
every step write pays one index entry fewer: an insert, and each non-HOT settle of a
step's rewards and readiness, which rewrites an entry in every index (an UPDATE of 1,000
W-pool step rows and its commit, alternated 30 times: median 67.1 ms against 71.1 ms;
bench.curation's readiness a tie within its noise, docs/benchmarks.md, twentieth session).
On SQLite a plain unique constraint, as before
(pool/models/constraints.py). PostgreSQL rebuilds the index: on a large pool the migration
takes as long as building one index of the step table.
"""

from django.db import migrations

import pool.models.constraints


class Migration(migrations.Migration):
    dependencies = [
        ("pool", "0026_step_uid_no_pattern_index"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="step",
            name="step_traj_index_uniq",
        ),
        migrations.RemoveIndex(
            model_name="step",
            name="step_curation",
        ),
        migrations.AddConstraint(
            model_name="step",
            constraint=pool.models.constraints.CoveringUniqueConstraint(
                fields=("trajectory", "step_index"),
                include=(
                    "id",
                    "readiness",
                    "quality_flags",
                    "policy_version",
                    "label",
                    "reward",
                    "reward_status",
                    "effective_reward",
                    "token_source",
                    "prompt_len",
                    "seq_len",
                    "created_at",
                    "source",
                ),
                name="step_traj_index_uniq",
            ),
        ),
    ]
