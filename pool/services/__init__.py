"""Write services of the pool. Every write goes through one of these functions; steps go
through the one step-write pipeline (pool/ingest/).

Each is keyword-only, runs in a transaction, and documents whether it is idempotent. Each
is imported from its own module (``pool.services.trajectories``, ...): this package
re-exports nothing. The step writes themselves are ``pool.ingest.pipeline``'s.
"""
