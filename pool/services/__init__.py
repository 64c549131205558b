"""Write services of the pool. Every write goes through one of these functions; steps go
through the one step-write pipeline (pool/ingest/).

Each is keyword-only, runs in a transaction, and documents whether it is idempotent.
"""

from ..ingest import IngestResult, StepIn, steps_append, steps_ingest
from .api_keys import api_key_create, api_key_revoke, api_key_rotate, api_key_verify
from .events import event_record, feedback_create, gateway_event_record
from .policy import policy_version_set
from .rewards import RewardIn, rewards_apply
from .trajectories import (
    CompletionIn,
    trajectories_complete,
    trajectory_complete,
    trajectory_create,
    trajectory_register,
)

__all__ = [
    "CompletionIn",
    "IngestResult",
    "RewardIn",
    "StepIn",
    "api_key_create",
    "api_key_revoke",
    "api_key_rotate",
    "api_key_verify",
    "event_record",
    "feedback_create",
    "gateway_event_record",
    "policy_version_set",
    "rewards_apply",
    "steps_append",
    "steps_ingest",
    "trajectories_complete",
    "trajectory_complete",
    "trajectory_create",
    "trajectory_register",
]
