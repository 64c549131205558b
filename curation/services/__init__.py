"""Write services of curation: users and roles, labels, datasets, review."""

from .datasets import dataset_create, dataset_update
from .labels import steps_label, trajectories_label
from .review import (
    review_claim_next,
    review_queue_create,
    review_queue_default,
    review_queue_update,
    review_release,
    review_submit,
    review_submit_group,
)
from .users import roles_ensure, user_create

__all__ = [
    "dataset_create",
    "dataset_update",
    "review_claim_next",
    "review_queue_create",
    "review_queue_default",
    "review_release",
    "review_submit",
    "review_submit_group",
    "review_queue_update",
    "roles_ensure",
    "steps_label",
    "trajectories_label",
    "user_create",
]
