"""The data pool: durable step-level MDP records, token storage and the prefix tree."""
