"""The step page shows a step's effective reward
(pool/services/effective_reward.py) and where it came from, as the API serves it: a step of
a trajectory rewarded 1.0 at completion reads "1 · final · trajectory's reward", never
"– pending" beside its reward_final readiness tag."""

from __future__ import annotations

import re

import pytest

from pool.ingest.pipeline import steps_ingest
from pool.models import Step
from pool.services.trajectories import CompletionIn, trajectories_complete
from tests.curation.test_pages import signed_in
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def _fact(html: str, name: str) -> str:
    m = re.search(rf'data-fact="{name}">([^<]*)<', html)
    assert m, f"no {name} fact on the page"
    return " ".join(m.group(1).split())


@pytest.mark.parametrize(
    ("own", "completion", "reward", "status_line"),
    [
        (None, 1.0, "1.0", "final · trajectory's reward · env"),
        (0.25, 1.0, "0.25", "final · step's reward · env"),
        (None, None, "–", "pending"),
    ],
)
def test_the_step_page_shows_the_effective_reward_and_its_scope(own, completion, reward, status_line):
    # given: a two-step trajectory, its last step rewarded (or not), completed with a reward (or not)
    steps_ingest(
        steps=[
            step_in("tp", 0, prompt=[1, 2, 3], response=[4, 5]),
            step_in("tp", 1, prompt=[1, 2, 3, 4, 5, 6], response=[7], reward=own),
        ]
    )
    trajectories_complete(completions=[CompletionIn(uid="tp", reward=completion)])
    last = Step.objects.get(uid="tp:1")
    # when: a reviewer opens the last step's page
    html = signed_in("reviewer").get(f"/steps/{last.id}/").content.decode()
    # then: the reward and its scope are the served ones
    assert _fact(html, "reward") == reward
    assert _fact(html, "reward-scope") == status_line


@pytest.mark.parametrize(
    ("index", "kinds"),
    [
        # step 0's own 0.5 is a process reward; the outcome is the trajectory's 1.0
        (0, "outcome 1.0 · process 0.5"),
        (1, "outcome 1.0 · process –"),
    ],
)
def test_the_step_page_shows_the_outcome_and_process_rewards_apart(index, kinds):
    # given: a two-step trajectory, a process reward on step 0, completed with the outcome 1.0
    steps_ingest(
        steps=[
            step_in("tk", 0, prompt=[1, 2, 3], response=[4, 5], reward=0.5),
            step_in("tk", 1, prompt=[1, 2, 3, 4, 5, 6], response=[7]),
        ]
    )
    trajectories_complete(completions=[CompletionIn(uid="tk", reward=1.0)])
    step = Step.objects.get(uid=f"tk:{index}")
    # when: a reviewer opens the step's page
    html = signed_in("reviewer").get(f"/steps/{step.id}/").content.decode()
    # then: both kinds, as stored
    assert _fact(html, "reward-kinds") == kinds
