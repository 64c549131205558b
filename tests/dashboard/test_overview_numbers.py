"""The overview's numbers agree with each other and with the API: after real traffic, every
counter of the served page (and the hello state it starts the websocket from) equals the
count the API gives (``GET /api/v1/stats``, the step list) or the database, where the API
has none. The live side (the counters after events) is tests/live_events/test_counters.py;
in a browser, tests/dashboard/test_dashboard_browser.py."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from curation.selectors.live import live_state
from tests.conftest import client_for
from tests.curation.test_pages import signed_in
from tests.dashboard.traffic import EXPECTED, api_numbers, consistent, drive, page_numbers, state_numbers

pytestmark = pytest.mark.django_db


@pytest.fixture
def traffic(agent_key, trainer_key, reader_key):
    drive(client_for(agent_key), client_for(trainer_key))
    return api_numbers(client_for(reader_key))


def test_every_overview_number_is_the_apis(traffic):
    # given the traffic, as the API counts it
    for key, value in EXPECTED.items():
        assert traffic[key] == value, key
    # when the overview is served
    resp = signed_in("operator").get("/")
    # then its state and every number on the page are the API's
    assert state_numbers(resp.context["state"]) == traffic
    shown = page_numbers(resp.content.decode())
    assert shown == {k: v for k, v in traffic.items() if k in shown}
    assert set(shown) == set(traffic), set(traffic) ^ set(shown)
    consistent(shown)


def test_the_curation_page_counts_as_the_overview(traffic):
    html = signed_in("operator").get("/curation/").content.decode()
    assert page_numbers(html) == {k: traffic[k] for k in page_numbers(html)}
    assert {"curate.ready_steps", "curate.awaiting_reward", "curate.ready_groups"} <= set(page_numbers(html))


def test_the_labels_say_what_each_counter_counts(traffic):
    html = signed_in("operator").get("/").content.decode()
    for label in [
        "steps stored",
        "trajectories</span>, ",
        "of them running",
        "of the steps with exact token ids",
        "retokenized from text",
        "with prompt drift",
        "steps ready to train (exact tokens, final reward, trajectory and group complete)",
        "with no final reward yet (own or trajectory's)",
        # one of each in the traffic: the word agrees with its count
        'ready <span data-plural="curate.ready_groups" data-one="group" data-many="groups">group</span>',
        'labelled <span data-plural="curate.labelled" data-one="step" data-many="steps">step</span>',
    ]:
        assert label in html, label


def test_the_counters_are_one_statement(traffic):
    # one SELECT holds every counter (one snapshot); the sources list is the second
    with CaptureQueriesContext(connection) as ctx:
        state = live_state(["overview"])
    assert len(ctx.captured_queries) == 2, [q["sql"] for q in ctx.captured_queries]
    assert state_numbers(state) == traffic
