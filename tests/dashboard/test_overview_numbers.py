"""The overview's numbers agree with each other and with the API: after real traffic, every
counter of the served page (and the hello state it starts the websocket from) equals the
count the API gives (``GET /api/v1/stats``, the step list) or the database, where the API
has none. The live side (the counters after events) is tests/live_events/test_counters.py;
in a browser, tests/dashboard/test_dashboard_browser.py."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from curation.selectors.live import live_state
from pool.models import PromptGroup
from pool.services.merge import group_merge_compute
from tests.conftest import client_for, make_step, post_steps
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


def test_running_is_one_count_on_the_overview_the_list_and_the_api(traffic, reader_key):
    # given the traffic (two trajectories still running), read once: nothing writes between
    api = client_for(reader_key)
    page = signed_in("operator")
    overview = page_numbers(page.get("/").content.decode())["collect.running"]
    listed = page.get("/trajectories/").content.decode()
    filtered = page.get("/trajectories/?status=running").content.decode()
    stats = api.get("/api/v1/stats").json()["trajectories_by_status"].get("running", 0)
    api_list = api.get("/api/v1/trajectories?status=running&page_size=100").json()["results"]
    # then the overview's "of them running", the list's running badges, the list filtered by
    # status, the stats and the trajectory list API count the same trajectories
    status = dict(
        re.findall(
            r'<tr data-uid="([^"]+)">\s*<td>(?:(?!</td>).)*</td>\s*<td><span class="badge (\w+)"',
            listed,
            re.S,
        )
    )
    assert len(status) == EXPECTED["collect.trajectories"]
    badges = [uid for uid, s in status.items() if s == "running"]
    rows = re.findall(r'<tr data-uid="([^"]+)">', filtered)
    assert overview == stats == len(badges) == len(rows) == len(api_list) == EXPECTED["collect.running"]
    assert set(badges) == set(rows) == {t["uid"] for t in api_list}


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


def _api_trajectories(reader) -> list[dict]:
    rows: list[dict] = []
    url = "/api/v1/trajectories?page_size=1000"
    while url:
        page = reader.get(url).json()
        rows += page["results"]
        url = page["next"]
    return rows


def _source_rows(html: str) -> dict[str, tuple[int, int]]:
    """The sources table of a page: name -> (trajectories, steps), as shown (1,234 read back)."""
    found = re.findall(
        r'<tr data-source="([^"]+)">.*?data-cell="trajectories">([\d,]+)<.*?data-cell="steps">([\d,]+)<',
        html,
        flags=re.S,
    )
    return {name: (int(t.replace(",", "")), int(s.replace(",", ""))) for name, t, s in found}


@pytest.mark.parametrize("url", ["/", "/trajectories/"])
def test_the_sources_are_the_data_sources_the_api_counts(traffic, reader_key, url):
    # given the traffic: an agent wrote every trajectory, a trainer only pulled and published
    expected: dict[str, list[int]] = {}
    for t in _api_trajectories(client_for(reader_key)):
        row = expected.setdefault(t["source"], [0, 0])
        row[0] += 1
        row[1] += t["step_count"]
    # when the page is served
    shown = _source_rows(signed_in("operator").get(url).content.decode())
    # then its sources are the API's data sources with the API's counts; the trainer and the
    # reader (consumer-only keys) are not among them
    assert shown == {name: tuple(v) for name, v in expected.items() if name}
    assert "trainer" not in shown and "reader" not in shown


def test_big_numbers_read_with_thousands_separators_as_the_api_counts(agent_key, reader_key):
    # given two rollouts of a group with a 1,500-token shared prompt, merged
    agent, reader = client_for(agent_key), client_for(reader_key)
    steps = [
        make_step(f"big-r{r}", 0, group="big", prompt=[7] * 1500, response=[r + 1] * 1200) for r in range(2)
    ]
    assert post_steps(agent, steps).status_code == 201
    group_merge_compute(group_id=PromptGroup.objects.get(uid="big").id)
    api_steps = reader.get("/api/v1/steps?page_size=1000").json()["results"]
    tree = reader.get("/api/v1/groups/big/prefix-tree").json()
    operator = signed_in("operator")
    # when the step list is served, then each row shows the API's token counts, separated
    html = operator.get("/steps/").content.decode()
    for s in api_steps:
        tokens = f"{len(s['prompt_ids']):,} + {len(s['response_ids']):,}"
        assert tokens == "1,500 + 1,200"
        assert f'<td data-cell="tokens" class="nowrap">{tokens}</td>' in html
    # and the optimization page's totals are the merge's, separated
    total, unique = tree["total_tokens"], tree["unique_tokens"]
    assert (total, total - unique) == (5400, 1500)
    html = operator.get("/optimization/").content.decode()
    assert f'data-stat="tokens-saved">{total - unique:,}<' in html
    assert f'<td data-cell="tokens">{total:,}</td>' in html and f"{total - unique:,} (28%)" in html
    # and the overview's counters are the same, separated
    numbers = page_numbers(operator.get("/").content.decode())
    assert (numbers["optimize.tokens"], numbers["optimize.tokens_saved"]) == (total, total - unique)
    assert 'data-live="optimize.tokens">5,400<' in operator.get("/").content.decode()
