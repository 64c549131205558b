"""The step-write pipeline (see pipeline.py): every step, from any door, enters the pool here.

contract.py   the step contract (wire struct, StepIn, derived field sets)
rules.py      the rules a write must satisfy (limits, rewards, uids, channels, JSON)
plan.py       hashes, parent choice for prefix deltas, Step rows
claim.py      step_index reservation hints for appends
effects.py    the ingest's own effects of a write (trajectory counters, group anchors)
pipeline.py   steps_ingest (batches) and steps_append (proxied calls)

The statements themselves are pool/sql.py, the pool's SQL toolkit; what follows a write is
the bus (pool/bus.py). Each name is imported from its own module: this package re-exports
nothing.
"""
