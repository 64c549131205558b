"""Write services of the pool. Every write goes through one of these functions.

Each is keyword-only, runs in a transaction, and documents whether it is idempotent.
"""

from .api_keys import api_key_create, api_key_verify
from .events import event_record, feedback_create
from .policy import policy_version_set
from .rewards import RewardIn, rewards_apply
from .steps import IngestResult, StepIn, steps_ingest
from .trajectories import trajectory_complete, trajectory_create

__all__ = [
    "IngestResult",
    "RewardIn",
    "StepIn",
    "api_key_create",
    "api_key_verify",
    "event_record",
    "feedback_create",
    "policy_version_set",
    "rewards_apply",
    "steps_ingest",
    "trajectory_complete",
    "trajectory_create",
]
