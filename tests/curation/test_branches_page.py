"""The trajectory page draws a trajectory's branches: one lane per branch, each branch's
first step joined to the step it branched from. The branches are made by the gateway's own
recording path (a main agent, a sub-agent with its own context, the main agent resuming,
then a rewrite of its last message), as in tests/gateway/test_proxy_recording.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
from django.test import Client

from curation.services.users import user_create
from gateway.proxy import branches
from gateway.proxy.recording import ProxiedCall, ProxiedChoice, record_call
from pool.ingest.claim import recent
from pool.models import Step
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

PROMPT = list(range(10, 40))


@pytest.fixture(autouse=True)
def _fresh_cache():
    recent.clear()
    branches.known.clear()
    yield
    recent.clear()
    branches.known.clear()


def chat(messages: list[dict], prompt: list[int], text: str, response: list[int], new: bool = False) -> None:
    ids = lambda v: np.array(v, dtype=np.int32)  # noqa: E731
    choice = ProxiedChoice(prompt_ids=ids(prompt), response_ids=ids(response), response_text=text)
    call = ProxiedCall(
        trajectory_uid="br", token_source="upstream", new_trajectory=new, messages=messages, choices=[choice]
    )
    record_call(call=call, source_id=None)


def operator() -> Client:
    client = Client()
    client.force_login(user_create(username="otto", role="operator", password="pw-pw-pw-123"))
    return client


def test_the_trajectory_page_draws_each_branch_and_where_it_forked(django_capture_on_commit_callbacks):
    # given: main agent (step 0), a sub-agent (step 1, branch 1 off 0), the main agent
    # resuming (step 2, branch 0), then rewriting its last message (step 3, branch 2 off 2)
    main = [{"role": "user", "content": "main <script>x()</script>"}]
    with django_capture_on_commit_callbacks(execute=True):
        chat(main, PROMPT, "r0", [1, 2, 3], new=True)
        chat([{"role": "user", "content": "sub"}], [7, 7, 7], "r1", [4])
        chat(
            [*main, {"role": "assistant", "content": "r0"}, {"role": "user", "content": "more"}],
            [*PROMPT, 1, 2, 3, 9],
            "r2",
            [5],
        )
        chat(
            [*main, {"role": "assistant", "content": "r0"}, {"role": "user", "content": "MORE"}],
            [*PROMPT, 1, 2, 3, 8],
            "r3",
            [6],
        )
    rows = list(
        Step.objects.filter(trajectory__uid="br").order_by("step_index").values_list("branch", flat=True)
    )
    assert rows == [0, 1, 0, 2]

    # when: an operator opens the trajectory page
    html = operator().get("/trajectories/br/").content.decode()

    # then: one dot per step in its branch's lane (three lanes, steps left to right), two
    # forks (step 0 -> 1, step 2 -> 3) and one edge along branch 0 (step 0 -> 2)
    section = html[html.index('id="branches"') :]
    section = section[: section.index("</section>")]
    dots = re.findall(r'data-step="(\d+)" data-branch="(\d+)" cx="(\d+)" cy="(\d+)"', section)
    assert [(int(s), int(b)) for s, b, _, _ in dots] == [(0, 0), (1, 1), (2, 0), (3, 2)]
    lanes = {int(b): int(cy) for _, b, _, cy in dots}
    assert lanes[0] < lanes[1] < lanes[2]
    assert [int(cx) for _, _, cx, _ in dots] == sorted(int(cx) for _, _, cx, _ in dots)
    assert section.count('class="edge fork"') == 2
    assert section.count('class="edge"') == 1
    assert "branch 1: 1 step from step 1, branched from step 0" in section
    assert "branch 2: 1 step from step 3, branched from step 2" in section
    # and each step in the timeline says its branch
    assert html.count('<span class="badge" data-branch="') == 3  # steps 1, 2 (parent set) and 3
    assert "<script>x()</script>" not in html


def test_a_trajectory_of_one_branch_draws_no_branches():
    from pool.ingest.pipeline import steps_ingest

    steps_ingest(
        steps=[
            step_in("plain", 0, prompt=[1, 2], response=[3]),
            step_in("plain", 1, prompt=[1, 2, 3, 4], response=[5]),
        ]
    )
    html = operator().get("/trajectories/plain/").content.decode()
    assert "Steps" in html and 'id="branches"' not in html
