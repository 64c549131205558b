"""The step-write pipeline (see pipeline.py): every step, from any door, enters the pool here.

contract.py   the step contract (wire struct, StepIn, derived field sets)
rules.py      the rules a write must satisfy (limits, rewards, uids, channels, JSON)
plan.py       hashes, parent choice for prefix deltas, Step rows
claim.py      step_index reservation hints for appends
effects.py    what follows a write, and the registry other apps plug into
pipeline.py   steps_ingest (batches) and steps_append (proxied calls)

The statements themselves are pool/sql.py, the pool's SQL toolkit.
"""

from .contract import StepIn
from .effects import StepsWritten, register
from .pipeline import (
    AppendTarget,
    IngestResult,
    TrajectorySpec,
    groups_ensure,
    policy_versions_ensure,
    steps_append,
    steps_ingest,
    trajectory_ensure,
)

__all__ = [
    "AppendTarget",
    "IngestResult",
    "StepIn",
    "StepsWritten",
    "TrajectorySpec",
    "groups_ensure",
    "policy_versions_ensure",
    "register",
    "steps_append",
    "steps_ingest",
    "trajectory_ensure",
]
