"""Reads of the pool: representations and aggregates, one module per kind of read.

* ``steps``: steps found and listed, their API representation (token ids rebuilt exactly),
  branch ends, a door's remembered texts, the step a Responses call answered with;
* ``trajectories``: trajectories and prompt groups, found, listed and rendered;
* ``events``: service events, feedback and policy versions, listed and rendered;
* ``stats``: the whole pool's counts and token economics.

The REST views (gateway/apis.py, curation/apis.py) read the pool through these, and filter
what they list with the FilterSets of gateway/filters.py: they never query the ORM
themselves. The public names are re-exported here; the project imports each from its own
module.
"""

from .events import (
    event_render,
    events_listed,
    feedback_listed,
    feedback_render,
    policy_version_render,
    policy_versions_list,
    policy_versions_listed,
)
from .stats import AWAITING_REWARD_VALUES, pool_stats
from .steps import (
    branch_ends,
    generation_texts,
    step_by_response_id,
    step_get,
    step_ids_by_uid,
    steps_listed,
    steps_render,
)
from .trajectories import (
    group_get,
    group_render,
    groups_listed,
    trajectories_listed,
    trajectory_get,
    trajectory_ids_by_uid,
    trajectory_render,
)

__all__ = [
    "AWAITING_REWARD_VALUES",
    "branch_ends",
    "event_render",
    "events_listed",
    "feedback_listed",
    "feedback_render",
    "generation_texts",
    "group_get",
    "group_render",
    "groups_listed",
    "policy_version_render",
    "policy_versions_list",
    "policy_versions_listed",
    "pool_stats",
    "step_by_response_id",
    "step_get",
    "step_ids_by_uid",
    "steps_listed",
    "steps_render",
    "trajectories_listed",
    "trajectory_get",
    "trajectory_ids_by_uid",
    "trajectory_render",
]
