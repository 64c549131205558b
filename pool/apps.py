from django.apps import AppConfig


class PoolConfig(AppConfig):
    name = "pool"
    verbose_name = "Data pool"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the ``__any`` lookup (pool/lookups.py) and the pool's effects on the bus
        (pool/bus.py), once, in the order they run."""
        from . import bus, live, lookups, tasks

        lookups.register()
        from .bus import (
            FeedbackRecorded,
            GroupMergeRequested,
            GroupsCompleted,
            GroupsReady,
            MergeDone,
            RewardsSet,
            StepsMergeRequested,
            StepsWritten,
            TrajectoriesEnded,
        )
        from .ingest import effects
        from .services import groups, readiness, rewards, trajectories

        # Stored steps. None of these queries after a fused append (quiet_on_append).
        for effect in (
            effects.trajectory_counters,
            effects.group_anchors,
            rewards.steps_written_rewards,
            readiness.steps_written_settle,
            groups.steps_written_groups,
            live.steps_written,
            trajectories.steps_written_ended,
        ):
            bus.register(effect, StepsWritten, quiet_on_append=True)
        # Ended trajectories: their computed reward, then the live event.
        bus.register(tasks.trajectories_ended_enqueue, TrajectoriesEnded)
        bus.register(live.trajectories_ended, TrajectoriesEnded)
        # Completed groups: their rollouts' readiness, then their merge and computed rewards.
        bus.register(readiness.groups_completed_settle, GroupsCompleted)
        bus.register(tasks.groups_completed_enqueue, GroupsCompleted)
        bus.register(live.groups_ready, GroupsReady)
        bus.register(live.rewards_set, RewardsSet)
        bus.register(live.feedback_recorded, FeedbackRecorded)
        bus.register(live.merge_done, MergeDone)
        bus.register(tasks.group_merge_enqueue, GroupMergeRequested)
        bus.register(tasks.steps_merge_enqueue, StepsMergeRequested)
        # Ready groups: the statistics of the tasks they rolled out (counted once per group).
        from .services import task_stats

        bus.register(task_stats.groups_ready_task_stats, GroupsReady)
