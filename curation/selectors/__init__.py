"""Reads of curation, one module per kind of read:

* ``specs``: what a dataset admits (a spec compiled to step predicates, its preview, its
  admitted steps and units) and the datasets with their versions;
* ``review``: the review queues, their scope, candidates and progress;
* ``pages``: the dashboard's list pages (overview, sources, trajectory and step browsers);
* ``timeline``: one trajectory and its steps (timeline, branches, step inspector, token ids);
* ``optimization``: prompt groups with their prefix-tree merges, and a merge laid out;
* ``live``: the dashboard's counters, one consistent read (the live websocket's state);
* ``consumption``: consumers' progress and health, leases and snapshots.

The public names are re-exported here, so ``from curation.selectors import X`` works; the
code of the project imports each from its own module.
"""

from .consumption import consumer_status, consumers_health, lease_body, leases_recent, snapshots_recent
from .live import live_state, state_for
from .optimization import group_get, optimization_overview, prefix_tree_layout
from .pages import (
    keyset_page,
    overview,
    policy_current,
    source_names,
    sources_health,
    steps_browse,
    trajectories_browse,
)
from .review import review_candidates, review_progress, review_queue_get, review_queues_list, review_scope
from .specs import (
    Compiled,
    dataset_admitted,
    dataset_preview,
    dataset_step_rows,
    dataset_steps,
    dataset_versions,
    datasets_list,
    datasets_with_current,
    spec_compile,
    units_admitted,
)
from .timeline import (
    StepInspect,
    StepView,
    branches_layout,
    step_inspect,
    step_token_ids,
    trajectory_timeline,
)

__all__ = [
    "Compiled",
    "StepInspect",
    "StepView",
    "branches_layout",
    "consumer_status",
    "consumers_health",
    "dataset_admitted",
    "dataset_preview",
    "dataset_step_rows",
    "dataset_steps",
    "dataset_versions",
    "datasets_list",
    "datasets_with_current",
    "group_get",
    "keyset_page",
    "lease_body",
    "leases_recent",
    "live_state",
    "optimization_overview",
    "overview",
    "policy_current",
    "prefix_tree_layout",
    "review_candidates",
    "review_progress",
    "review_queue_get",
    "review_queues_list",
    "review_scope",
    "snapshots_recent",
    "source_names",
    "sources_health",
    "spec_compile",
    "state_for",
    "step_inspect",
    "step_token_ids",
    "steps_browse",
    "trajectories_browse",
    "trajectory_timeline",
    "units_admitted",
]
