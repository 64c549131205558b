from django.apps import AppConfig


class CurationConfig(AppConfig):
    name = "curation"
    verbose_name = "Curation"

    def ready(self) -> None:
        """Register curation's effects in the pool's registry (the bus, pool/bus.py), once."""
        from pool import bus

        from . import events, tasks
        from .services import consume, counts, lineage

        bus.register(events.snapshot_live, events.SnapshotChanged)
        bus.register(tasks.snapshot_build_enqueue, events.SnapshotRequested)
        bus.register(tasks.dataset_count_enqueue, events.DatasetVersionCurrent)
        bus.register(events.lease_live, events.LeaseChanged)
        # Serving order priority: a ready group's scores (curation/models.py GroupScore).
        bus.register(consume.group_scores_refresh, bus.GroupsReady)
        # Lineage: a policy version published with a run is a checkpoint of that run.
        bus.register(lineage.checkpoint_record, bus.PolicyPublished)
        # Counts kept per saved dataset (services/counts.py): the units each write changed.
        bus.register(counts.steps_written, bus.StepsWritten, quiet_on_append=True)
        for effect, event in (
            (counts.trajectories_ended, bus.TrajectoriesEnded),
            (counts.groups_completed, bus.GroupsCompleted),
            (counts.groups_ready, bus.GroupsReady),
            (counts.rewards_set, bus.RewardsSet),
            (counts.labels_set, bus.LabelsSet),
            (counts.feedback_recorded, bus.FeedbackRecorded),
            (counts.units_changed_event, bus.UnitsChanged),
        ):
            bus.register(effect, event)
