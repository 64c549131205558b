from django.apps import AppConfig


class CurationConfig(AppConfig):
    name = "curation"
    verbose_name = "Curation"

    def ready(self) -> None:
        """Register curation's effects in the pool's registry (pool/ingest/effects.py), once."""
        from pool.ingest import effects

        from . import events, tasks
        from .services import consume, lineage

        effects.register(events.snapshot_live, events.SnapshotChanged)
        effects.register(tasks.snapshot_build_enqueue, events.SnapshotRequested)
        effects.register(events.lease_live, events.LeaseChanged)
        # Serving order priority: a ready group's scores (curation/models.py GroupScore).
        effects.register(consume.group_scores_refresh, effects.GroupsReady)
        # Lineage: a policy version published with a run is a checkpoint of that run.
        effects.register(lineage.checkpoint_record, effects.PolicyPublished)
