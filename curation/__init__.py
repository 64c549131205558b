"""Curation and consumption: what trainers may get (datasets, leases, snapshots, lineage,
retention) and what people see (the pages, review, the admin and the live dashboard)."""
