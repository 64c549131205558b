"""The admin for curation work: steps, trajectories and prompt groups with their curation
actions and list filters (steps.py, filters.py), and curation's own records: datasets and
their versions, review queues and claims, the label audit and step tags (records.py); retention policies
and their archives (retention.py). The
pool's operational rows (sources, keys, policy versions, audit rows) are pool/admin.py."""

from . import records, retention, steps

__all__ = ["records", "retention", "steps"]
