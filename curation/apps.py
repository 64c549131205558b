from django.apps import AppConfig


class CurationConfig(AppConfig):
    name = "curation"
    verbose_name = "Curation"

    def ready(self) -> None:
        """Register curation's effects in the pool's registry (the bus, pool/bus.py), once."""
        from pool import bus

        from . import events, tasks
        from .services import consume, lineage

        bus.register(events.snapshot_live, events.SnapshotChanged)
        bus.register(tasks.snapshot_build_enqueue, events.SnapshotRequested)
        bus.register(events.lease_live, events.LeaseChanged)
        # Serving order priority: a ready group's scores (curation/models.py GroupScore).
        bus.register(consume.group_scores_refresh, bus.GroupsReady)
        # Lineage: a policy version published with a run is a checkpoint of that run.
        bus.register(lineage.checkpoint_record, bus.PolicyPublished)
