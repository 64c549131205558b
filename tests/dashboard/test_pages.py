"""The dashboard pages (one per lifecycle stage) through Django's test client on a real
database: who may open what, empty states, filters, the step inspector, the prefix-tree
view, batch configuration, snapshots, leases and their replay, and escaping."""

from __future__ import annotations

import re
import uuid

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from curation import charts
from curation.models import Lease, Snapshot
from curation.services.consume import PullIn, consumer_pull
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.models import Event, Source, Step
from tests.curation.test_pages import finished, signed_in
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

PAGES = ["/", "/trajectories/", "/steps/", "/curation/", "/optimization/", "/consumption/"]
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">"><svg onload="window.__xss=3">'


@pytest.fixture
def pool_data():
    """Two completed trajectories with text (t1, t2), one of a named source with only
    token ids (a1), a two-rollout prompt group (g1), and a dataset over every step."""
    finished("t1")
    finished("t2", seed=5)
    src = Source.objects.create(name="agent-a")
    steps_ingest(steps=[step_in("a1", 0, prompt=[7, 8, 9], response=[1, 2])], source_id=src.id, channel="val")
    steps_ingest(
        steps=[
            step_in(f"g1-r{r}", 0, prompt=[5, 5, 5, 5, 5, 5], response=[r + 1, r + 2, r + 3], group="g1")
            for r in range(2)
        ]
    )
    dataset_create(
        name="ds",
        spec={"grouping": {"keep_groups_whole": False}, "filters": {"readiness": "any"}},
        actor="setup",
    )


# --- access -------------------------------------------------------------------------------------
@pytest.mark.parametrize("url", [*PAGES, "/steps/1/", "/optimization/groups/g1/"])
def test_anonymous_users_are_sent_to_sign_in(url):
    resp = Client().get(url)
    assert resp.status_code == 302
    assert resp["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("url", PAGES)
def test_a_user_without_a_role_is_refused(url):
    assert signed_in("nobody").get(url).status_code == 403


@pytest.mark.parametrize(
    ("url", "reviewer", "operator"),
    [
        ("/", 200, 200),
        ("/trajectories/", 200, 200),
        ("/steps/", 200, 200),
        ("/curation/", 403, 200),
        ("/optimization/", 200, 200),
        ("/optimization/groups/g1/", 200, 200),
        ("/consumption/", 200, 200),
    ],
)
def test_each_page_needs_its_roles_permission(pool_data, url, reviewer, operator):
    assert signed_in("reviewer").get(url).status_code == reviewer
    assert signed_in("operator").get(url).status_code == operator


def test_the_layout_links_every_stage_and_signs_out_by_post():
    html = signed_in("operator").get("/").content.decode()
    for href, label in [
        ("/", "Overview"),
        ("/trajectories/", "Trajectories"),
        ("/steps/", "Representation"),
        ("/curation/", "Curation"),
        ("/optimization/", "Optimization"),
        ("/consumption/", "Consumption"),
    ]:
        assert f'<a href="{href}"' in html and label in html
    assert 'method="post" action="/logout/"' in html
    assert 'id="live-status"' in html and "claw/live.js" in html and 'data-topics="overview"' in html
    # a reviewer does not see the curation link
    assert 'href="/curation/"' not in signed_in("reviewer").get("/").content.decode()


def test_logout_refuses_a_post_without_csrf_token():
    client = signed_in("operator", csrf=True)
    assert client.post("/logout/").status_code == 403
    assert client.get("/").status_code == 200  # still signed in


# --- empty states ---------------------------------------------------------------------------------
def test_empty_pool_pages_say_what_to_do_next():
    client = signed_in("operator")
    home = client.get("/").content.decode()
    assert 'data-empty="agent"' in home and "http://testserver/v1" in home and "create_api_key" in home
    assert 'data-empty="agent"' in client.get("/trajectories/").content.decode()
    assert 'data-empty="agent"' in client.get("/steps/").content.decode()
    opt = client.get("/optimization/").content.decode()
    assert "No prompt groups yet" in opt and "No group is merged yet" in opt
    cons = client.get("/consumption/").content.decode()
    assert (
        'data-empty="datasets"' in cons
        and "No snapshots yet" in cons
        and "No consumer has pulled yet" in cons
    )


# --- overview -------------------------------------------------------------------------------------
def test_overview_counts_every_stage_and_the_rates(pool_data):
    Event.objects.create(type="upstream_error", payload={"status": 502})
    resp = signed_in("operator").get("/")
    html = resp.content.decode()
    state = resp.context["state"]
    assert state["collect"]["steps"] == 7 and state["collect"]["trajectories"] == 5
    assert state["represent"]["exact"] == 7 and state["represent"]["drift"] == 0
    assert state["curate"]["ready_steps"] == 4  # t1 and t2 are complete with final rewards
    assert 'data-live="collect.steps" data-stat="steps">7<' in html
    # one failed call of 8 calls in the window
    assert resp.context["error_rate"] == pytest.approx(1 / 8)
    assert 'data-stat="error-rate">12%<' in html or 'data-stat="error-rate">13%<' in html
    assert 'data-stat="drift-rate">0%<' in html
    # the rate chart has one point per minute and counts this minute's steps
    assert resp.context["rate"][-1]["steps"] == 7
    assert html.count("<polyline") == 1
    # sources and their health
    assert '<tr data-source="agent-a">' in html


# --- collection -----------------------------------------------------------------------------------
def test_collection_filters_by_source_channel_and_status(pool_data):
    client = signed_in("reviewer")
    rows = lambda resp: [t.uid for t in resp.context["rows"]]  # noqa: E731
    assert set(rows(client.get("/trajectories/"))) == {"t1", "t2", "a1", "g1-r0", "g1-r1"}
    assert rows(client.get("/trajectories/?source=agent-a")) == ["a1"]
    assert rows(client.get("/trajectories/?channel=val")) == ["a1"]
    assert set(rows(client.get("/trajectories/?status=completed"))) == {"t1", "t2"}
    html = client.get("/trajectories/?status=completed&source=agent-a").content.decode()
    assert "No trajectories match these filters" in html
    # the live rows get the same filter
    assert 'data-filter-status="completed" data-filter-channel=""' in html
    assert 'data-filter-source="agent-a"' in html


# --- representation -------------------------------------------------------------------------------
def test_step_list_filters_and_links_to_the_inspector(pool_data):
    client = signed_in("reviewer")
    resp = client.get("/steps/")
    assert len(resp.context["rows"]) == 7
    step = Step.objects.get(uid="t1:1")
    assert f'href="/steps/{step.id}/"' in resp.content.decode()
    assert [s.uid for s in client.get("/steps/?source=agent-a").context["rows"]] == ["a1:0"]
    assert client.get("/steps/?token_source=retokenized").context["rows"] == []
    assert client.get("/steps/?drift=on").context["rows"] == []


def test_step_inspector_shows_text_tokens_source_reward_and_neighbours(pool_data):
    step = Step.objects.get(uid="t1:1")
    html = signed_in("reviewer").get(f"/steps/{step.id}/").content.decode()
    assert "question 1 of t1" in html and "answer 1" in html
    assert f'data-url="/steps/{step.id}/tokens"' in html
    assert 'data-fact="token_source">client<' in html
    assert 'data-fact="reward">1.0<' in html
    assert 'rel="prev"' in html and 'rel="next"' not in html


def test_step_inspector_without_text_says_so(pool_data, settings):
    settings.CLAW_TOKENIZER = ""
    step = Step.objects.get(uid="a1:0")
    html = signed_in("reviewer").get(f"/steps/{step.id}/").content.decode()
    assert "Text unknown" in html and "CLAW_TOKENIZER" in html
    assert signed_in("operator").get("/steps/999999/").status_code == 404


def test_step_inspector_decodes_ids_with_the_configured_tokenizer(settings, tmp_path):
    from transformers import AutoTokenizer

    from tests.gateway.proxy_support import build_tokenizer

    # given a local tokenizer and a step stored with token ids only
    settings.CLAW_TOKENIZER = str(build_tokenizer(tmp_path / "tok"))
    tok = AutoTokenizer.from_pretrained(settings.CLAW_TOKENIZER, local_files_only=True)
    prompt, response = tok.encode("what is <b>two</b>?"), tok.encode("four & more")
    steps_ingest(steps=[step_in("dec", 0, prompt=prompt, response=response)])
    step = Step.objects.get(uid="dec:0")
    # then the inspector shows the ids decoded (escaped), and says so
    html = signed_in("reviewer").get(f"/steps/{step.id}/").content.decode()
    assert "what is &lt;b&gt;two&lt;/b&gt;?" in html and "four &amp; more" in html
    assert "Decoded from the token ids" in html


# --- curation -------------------------------------------------------------------------------------
def test_curation_page_shows_the_ready_counts(pool_data):
    html = signed_in("operator").get("/curation/").content.decode()
    assert 'data-live="curate.ready_steps">4<' in html
    assert 'data-topics="curation"' in html


# --- optimization ---------------------------------------------------------------------------------
def test_group_view_draws_the_prefix_tree_and_the_list_shows_savings(pool_data):
    client = signed_in("reviewer")
    resp = client.get("/optimization/groups/g1/")
    html = resp.content.decode()
    layout = resp.context["layout"]
    # two rollouts sharing a 6-token prompt: a shared trunk and two branches
    shared = [b for b in layout["boxes"] if b["shared"]]
    assert len(shared) == 1 and shared[0]["length"] == 6 and shared[0]["branches"] == 2
    assert html.count('<rect class="node') == 3
    r0 = Step.objects.get(uid="g1-r0:0")
    # spans read as token ranges, their steps by trajectory and index (the uid on hover)
    assert f'<a href="/steps/{r0.id}/" title="step g1-r0:0">g1-r0 · step 0</a>' in html
    assert '<strong>tokens 0–5</strong> <span class="muted small">6 tokens</span>' in html
    assert html.count('<strong>tokens 6–8</strong> <span class="muted small">3 tokens</span>') == 2
    assert resp.context["merge"]["total_tokens"] == 18 and resp.context["merge"]["unique_tokens"] == 12
    # the list now shows the group's savings and the chart draws it
    resp = client.get("/optimization/")
    assert resp.context["saved"] == 6 and resp.context["merged_groups"] == 1
    assert 'id="savings-chart"' in resp.content.decode()
    assert client.get("/optimization/groups/nope/").status_code == 404


# --- consumption ----------------------------------------------------------------------------------
def test_batch_configuration_previews_the_pull(pool_data):
    client = signed_in("reviewer")
    resp = client.get("/consumption/")
    config = resp.context["config"]
    assert config["pull"] == {"dataset": "ds", "batch_size": 64, "unit": "steps", "format": "steps"}
    assert config["preview"]["steps"] == 7
    resp = client.get("/consumption/?dataset=ds&batch_size=8&format=tree&unit=steps&max_staleness=0")
    config = resp.context["config"]
    assert config["pull"]["batch_size"] == 8 and config["pull"]["format"] == "tree"
    assert config["max_staleness"] == 0
    assert "&quot;format&quot;: &quot;tree&quot;" in resp.content.decode()
    assert "Select a valid choice" in client.get("/consumption/?dataset=nope").content.decode()


def test_operators_request_snapshots_and_reviewers_may_not(pool_data):
    assert signed_in("reviewer").post("/consumption/", {"dataset": "ds"}).status_code == 403
    client = signed_in("operator")
    resp = client.post("/consumption/", {"dataset": "ds"})
    assert resp.status_code == 302 and resp["Location"] == "/consumption/#snapshots"
    snap = Snapshot.objects.get()
    html = client.get("/consumption/").content.decode()
    assert f'data-snapshot="{snap.id}"' in html and "<progress" in html
    assert client.post("/consumption/", {"dataset": "nope"}).status_code == 400


def test_leases_are_listed_with_consumers_and_replayable(pool_data):
    lease = consumer_pull(consumer="trainer-1", pull=PullIn(dataset="ds", batch_size=2, unit="steps"))
    client = signed_in("reviewer")
    html = client.get("/consumption/").content.decode()
    assert f'href="/consumption/leases/{lease.id}/batch"' in html
    assert '<tr data-consumer="trainer-1">' in html
    assert client.get("/consumption/").context["consumers"][0]["open"] == 1
    replay = client.get(f"/consumption/leases/{lease.id}/batch")
    assert replay.status_code == 200 and replay.content == bytes(Lease.objects.get(id=lease.id).body)
    assert client.get(f"/consumption/leases/{uuid.uuid4()}/batch").status_code == 404


# --- cost ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("url", [*PAGES, "/optimization/groups/g1/"])
def test_page_queries_do_not_grow_with_the_pool(pool_data, url):
    client = signed_in("operator")
    client.get(url)  # warm-up: sessions, permissions, the group's first merge

    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(url).status_code == 200
        return len(ctx.captured_queries)

    before = queries()
    # given more of everything: sources, trajectories, steps, groups, merges, leases
    for i in range(3):
        finished(f"more{i}", seed=10 + i)
        src = Source.objects.create(name=f"more-src-{i}")
        steps_ingest(steps=[step_in(f"m{i}", 0, prompt=[1, i], response=[2], group="g1")], source_id=src.id)
    consumer_pull(consumer=f"trainer-{i}", pull=PullIn(dataset="ds", batch_size=1, unit="steps"))
    client.get("/optimization/groups/g1/")  # the group changed: merged again once
    # then the page costs the same number of queries
    assert queries() == before


# --- safety ---------------------------------------------------------------------------------------
def test_user_content_is_escaped_on_every_page(pool_data):
    src = Source.objects.create(name=XSS[:100])
    steps_ingest(
        steps=[
            step_in(
                "x" + XSS[:60],
                0,
                prompt=[1, 2],
                response=[3],
                group="g" + XSS[:60],
                messages=[{"role": XSS, "content": XSS}],
                response_text=XSS,
                metadata={"note": XSS},
            )
        ],
        source_id=src.id,
    )
    step = Step.objects.get(trajectory__uid="x" + XSS[:60])
    client = signed_in("operator")
    for url in [*PAGES, f"/steps/{step.id}/", f"/trajectories/?source={XSS[:20]}"]:
        html = client.get(url).content.decode()
        assert "<script>window" not in html, url
        assert "<img src=x" not in html, url
        assert "<svg onload" not in html, url


# --- one trajectory list, favicon, chart axes -----------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("/collection/", "/trajectories/"),
        ("/collection/?source=agent-a&status=completed", "/trajectories/?source=agent-a&status=completed"),
    ],
)
def test_collection_is_the_trajectory_list(pool_data, old, new):
    # given a bookmark of the old collection page, when it is opened
    client = signed_in("reviewer")
    resp = client.get(old)
    # then it lands on the one trajectory list, with its filters
    assert resp.status_code == 302 and resp["Location"] == new
    html = client.get("/trajectories/").content.decode()
    # and that list is live and in the nav, marked as the current page
    assert 'data-topics="collection"' in html and "data-live-rows" in html
    assert '<a href="/trajectories/" aria-current="page">Trajectories</a>' in html
    assert 'href="/collection/"' not in html


def test_every_page_links_the_favicon_and_favicon_ico_answers():
    html = signed_in("operator").get("/").content.decode()
    assert '<link rel="icon" href="/static/claw/favicon.svg" type="image/svg+xml">' in html
    resp = Client().get("/favicon.ico")
    assert resp.status_code == 301 and resp["Location"] == "/static/claw/favicon.ico"


@pytest.mark.parametrize(
    ("top", "ticks"),
    [
        (0, [0, 1]),
        (3, [0, 1, 2, 3]),
        (7, [0, 2, 4, 6, 8]),
        (37, [0, 10, 20, 30, 40]),
        (1234, [0, 500, 1000, 1500]),
    ],
)
def test_chart_ticks_are_round_and_cover_the_peak(top, ticks):
    assert charts.nice_ticks(top) == ticks


def test_the_ingestion_chart_has_a_y_axis_with_its_unit_and_time_ticks(pool_data):
    # given 7 steps stored this minute, when the overview is served
    resp = signed_in("operator").get("/")
    html = resp.content.decode()
    chart = html[html.index('id="rate-chart"') : html.index("</figure>")]
    # then the y axis is labelled 0 to the peak's round top, the top one with the unit
    labels = re.findall(r'data-tick="\d+">([^<]*)</text>', chart)
    assert labels == ["0", "2", "4", "6", "8 steps/min"]
    # and the x axis shows times (HH:MM), the last being this minute
    times = re.findall(r'data-time x="[\d.]+%" y="\d+" text-anchor="\w+">(\d\d:\d\d)</text>', chart)
    assert len(times) >= 5
    assert times[-1] == timezone.localtime(resp.context["rate"][-1]["minute"]).strftime("%H:%M")
    assert 'peak <span data-chart="max">7</span> steps/min' in chart


def test_sources_that_only_wrote_events_are_data_sources_and_consumers_are_not(pool_data):
    # given a service that only posted events, and a trainer and a reader that wrote nothing
    svc = Source.objects.create(name="reward-svc", kind=Source.Kind.SERVICE)
    Event.objects.create(type="env_feedback", source=svc, payload={})
    Source.objects.create(name="trainer-1", kind=Source.Kind.TRAINER)
    Source.objects.create(name="reader-1", kind=Source.Kind.AGENT)
    client = signed_in("operator")
    for url in ["/", "/trajectories/"]:
        # when the page lists its sources
        html = client.get(url).content.decode()
        listed = re.findall(r'<tr data-source="([^"]+)">', html)
        # then the writers are there, the service with no trajectory, and no consumer
        assert sorted(listed) == ["agent-a", "reward-svc"], (url, listed)
