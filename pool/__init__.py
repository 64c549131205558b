"""The data pool: durable step-level MDP records with prefix-delta token storage, the one
step-write pipeline (ingest/), the bus of what follows a write, and the services and selectors
every door and page go through."""
