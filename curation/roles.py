"""Roles of the people who use the pages: Django groups with the permissions each role needs.

* reviewer: view the pool and give feedback;
* operator: a reviewer who also curates (changes steps, trajectories, groups, feedback);
* admin: everything (a superuser).

Roles are pool-wide: an account belongs to no source (pool/tenancy.py is for API keys), so
every role's pages show every source's rows (the consumption page, datasets and snapshots
included). The REST API answers a signed-in account with staff access only.
"""

from __future__ import annotations

REVIEWER, OPERATOR, ADMIN = "reviewer", "operator", "admin"
ROLES = (REVIEWER, OPERATOR, ADMIN)

_VIEW = [
    "view_step",
    "view_trajectory",
    "view_promptgroup",
    "view_policyversion",
    "view_rewardevent",
    "view_feedback",
    "view_event",
    "view_mergeresult",
    "view_rewardfailure",
]
# Codenames of the pool app's permissions each group holds (admin is a superuser instead).
PERMISSIONS: dict[str, list[str]] = {
    REVIEWER: [*_VIEW, "add_feedback"],
    OPERATOR: [
        *_VIEW,
        "add_feedback",
        "change_feedback",
        "change_step",
        "change_trajectory",
        "change_promptgroup",
        # Reward functions name code by dotted path: operators see them, admins change them.
        "view_rewardfunction",
    ],
}
