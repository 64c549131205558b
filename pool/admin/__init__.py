"""Admin of the pool: curation views of steps, trajectories and groups (curation.py, with the
list filters of filters.py) and the operational rows (operations.py)."""

from . import curation, operations

__all__ = ["curation", "operations"]
