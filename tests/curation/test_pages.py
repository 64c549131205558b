"""The pages for people (curation/views/) through Django's test client on a real database:
who may open what, what the trajectory page shows, the builder's live preview, datasets and
their versions, CSRF, and the review loop (claim, submit, next; skip; rewards from ratings)."""

from __future__ import annotations

import html as htmllib
import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from curation.models import Dataset, ReviewClaim
from curation.selectors.specs import dataset_preview
from curation.services.datasets import dataset_create
from curation.services.users import user_create
from curation.specs import spec_parse
from pool.ingest.pipeline import steps_ingest
from pool.models import Feedback, RewardEvent, Step, Trajectory
from pool.services.trajectories import trajectory_complete
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

PASSWORD = "pages-test-password-1"


def finished(traj: str, *, text: bool = True, seed: int = 0, **extra) -> list[Step]:
    """A completed two-step trajectory with final rewards; with ``text`` its steps carry
    chat messages and response text, else only token ids."""
    batch = []
    prompt = [1, 2, 3, seed]
    for i in range(2):
        text_fields = (
            {
                "messages": [{"role": "user", "content": f"question {i} of {traj}"}],
                "response_text": f"answer {i}",
            }
            if text
            else {}
        )
        batch.append(
            step_in(
                traj,
                i,
                prompt=prompt,
                response=[10 + seed, 11 + i, 12],
                rollout_logprobs=[-0.1, -0.2, -0.3],
                reward=1.0,
                is_last=i == 1,
                **text_fields,
                **extra,
            )
        )
        prompt = prompt + [10 + seed, 11 + i, 12, 99]
    result = steps_ingest(steps=batch)
    trajectory_complete(uid=traj)
    return sorted(result.created, key=lambda s: s.step_index)


def signed_in(role: str | None, *, csrf: bool = False) -> Client:
    """A client signed in as a fresh user of ``role`` ("nobody": a user without a role;
    None: anonymous)."""
    client = Client(enforce_csrf_checks=csrf)
    if role is None:
        return client
    if role == "nobody":
        from django.contrib.auth import get_user_model

        user = get_user_model().objects.create_user("nobody", password=PASSWORD)
    else:
        user = user_create(username=role, role=role, password=PASSWORD)
    client.force_login(user)
    return client


@pytest.fixture
def pool_data():
    steps = finished("t1")
    finished("t2", seed=5)
    dataset_create(name="ds", spec={}, actor="setup")
    return {"step": steps[0].id}


LOGIN = "login"  # a redirect to the sign-in page, with ?next=
ROLES = (None, "nobody", "reviewer", "operator", "admin")

# (method, url, data, expected status per role in ROLES order)
MATRIX = [
    ("get", "/", None, (LOGIN, 403, 200, 200, 200)),  # the overview needs pool.view_trajectory
    ("get", "/login/", None, (200, 302, 302, 302, 302)),
    ("post", "/logout/", {}, (302, 302, 302, 302, 302)),
    ("get", "/trajectories/", None, (LOGIN, 403, 200, 200, 200)),
    ("get", "/trajectories/?status=completed&has_ready=on", None, (LOGIN, 403, 200, 200, 200)),
    ("get", "/trajectories/t1/", None, (LOGIN, 403, 200, 200, 200)),
    ("get", "/trajectories/missing/", None, (LOGIN, 403, 404, 404, 404)),
    ("get", "/steps/{step}/tokens", None, (LOGIN, 403, 200, 200, 200)),
    ("post", "/trajectories/t1/", {"action": "accepted"}, (LOGIN, 403, 403, 302, 302)),
    ("get", "/curation/", None, (LOGIN, 403, 403, 200, 200)),
    ("get", "/curation/?dataset=ds", None, (LOGIN, 403, 403, 200, 200)),
    ("post", "/curation/", {"name": "saved", "readiness": "ready", "short_groups": "drop"}, (LOGIN, 403, 403, 302, 302)),
    ("post", "/curation/preview", "{}", (LOGIN, 403, 403, 200, 200)),
    ("get", "/curation/datasets/ds/", None, (LOGIN, 403, 403, 200, 200)),
    ("get", "/review/", None, (LOGIN, 403, 200, 200, 200)),
    ("get", "/review/default/", None, (LOGIN, 403, 200, 200, 200)),
    ("post", "/review/", {"action": "skip", "claim": "0"}, (LOGIN, 403, 302, 302, 302)),
    ("get", "/review/queues/", None, (LOGIN, 403, 200, 200, 200)),
    ("post", "/review/queues/", {"name": "q", "rating_min": "1", "rating_max": "5"}, (LOGIN, 403, 403, 302, 302)),
]  # fmt: skip


@pytest.mark.parametrize(
    "method,url,data,role,expected",
    [
        pytest.param(m, u, d, role, exp[i], id=f"{m} {u} as {role or 'anonymous'}")
        for m, u, d, exp in MATRIX
        for i, role in enumerate(ROLES)
    ],
)
def test_role_matrix(pool_data, method, url, data, role, expected):
    # given a client of this role
    client = signed_in(role)
    url = url.format(**pool_data)
    # when it requests the page
    if method == "get":
        resp = client.get(url)
    elif isinstance(data, str):
        resp = client.post(url, data, content_type="application/json")
    else:
        resp = client.post(url, data)
    # then it gets the expected status, anonymous users the sign-in page
    if expected == LOGIN:
        assert resp.status_code == 302
        assert resp["Location"].startswith("/login/?next=")
    else:
        assert resp.status_code == expected, resp.content[:500]


def test_sign_in_on_the_pages_own_form_as_a_reviewer():
    # given a reviewer (not staff: the admin's sign-in would refuse them)
    user_create(username="rita", role="reviewer", password=PASSWORD)
    client = Client()
    # when they sign in on /login/
    resp = client.post("/login/", {"username": "rita", "password": PASSWORD, "next": "/review/"})
    # then they land where they were going
    assert resp.status_code == 302 and resp["Location"] == "/review/"
    assert client.get("/review/").status_code == 200
    # and a wrong password is refused on the same page
    assert (
        "Wrong username or password" in Client().post("/login/", {"username": "rita", "password": "x"}).text
    )


def test_trajectory_page_shows_text_flags_and_escapes_it():
    # given a trajectory with text, one step truncated, and one without text
    finished("t", finish_reason="length")
    steps_ingest(
        steps=[step_in("ids-only", 0, prompt=[1, 2, 3, 4, 5], response=[6, 7], reward=0.0, is_last=True)]
    )
    Step.objects.filter(uid="t:0").update(response_text="<script>alert(1)</script>")
    client = signed_in("reviewer")
    # when the reviewer opens it
    page = client.get("/trajectories/t/").text
    # then each step's prompt and response text is there, escaped
    assert "question 0 of t" in page and "answer 1" in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # and readiness and quality flag names, and the token source
    assert 'data-readiness="tokens_exact"' in page and 'data-readiness="trajectory_complete"' in page
    assert 'data-quality="truncated"' in page
    assert "tokens: client" in page
    # and a step without text says how many tokens it has instead
    page = client.get("/trajectories/ids-only/").text
    assert "text unknown (5 tokens)" in page and "text unknown (2 tokens)" in page


def test_a_step_without_text_is_decoded_where_a_tokenizer_is_configured(settings):
    # given a white-box step of ids only, and the demo's toy tokenizer configured
    settings.CLAW_TOKENIZER = "demo"
    from claw_kit.llm.tokenizer import get_tokenizer

    tok = get_tokenizer()
    prompt, response = tok.encode("what is six times seven?"), tok.encode("forty-two")
    steps_ingest(steps=[step_in("decoded", 0, prompt=prompt, response=response, reward=1.0, is_last=True)])
    # when a reviewer opens its trajectory
    page = htmllib.unescape(signed_in("reviewer").get("/trajectories/decoded/").text)
    # then its prompt and response read as text, saying which tokenizer decoded them
    assert "text unknown" not in page
    assert tok.decode(prompt) in page and tok.decode(response) in page
    assert f"decoded from its {len(response)} token ids by" in page and 'data-decoded-by="' in page


def test_token_ids_on_demand_are_exact():
    steps = finished("t")
    resp = signed_in("reviewer").get(f"/steps/{steps[1].id}/tokens")
    assert resp.json()["prompt_ids"] == [1, 2, 3, 0, 10, 11, 12, 99]
    assert resp.json()["response_ids"] == [10, 12, 12]


def test_operator_labels_a_trajectory_and_sees_the_history():
    # given an operator on a trajectory page
    finished("t")
    client = signed_in("operator")
    # when they reject it with a tag and a note
    resp = client.post(
        "/trajectories/t/", {"action": "rejected", "tag_add": "off-topic", "note": "wrong task"}
    )
    # then every step is labelled, and the page shows label, tag, note and who did it
    assert resp.status_code == 302
    assert set(Step.objects.filter(trajectory__uid="t").values_list("label", "note")) == {
        ("rejected", "wrong task")
    }
    page = client.get("/trajectories/t/").text
    assert 'data-label="rejected"' in page and "off-topic" in page and "wrong task" in page
    assert "Label history (1)" in page and "operator:" in page
    # and clearing the label is a change too
    client.post("/trajectories/t/", {"action": "clear"})
    assert set(Step.objects.filter(trajectory__uid="t").values_list("label", flat=True)) == {""}


def test_reviewers_see_no_label_form():
    finished("t")
    assert 'id="label-form"' not in signed_in("reviewer").get("/trajectories/t/").text
    assert 'id="label-form"' in signed_in("operator").get("/trajectories/t/").text


def test_trajectory_list_filters_and_reads_a_bounded_number_of_queries():
    finished("a")
    steps_ingest(steps=[step_in("running", 0, prompt=[1], response=[2])])
    client = signed_in("reviewer")
    page = client.get("/trajectories/?status=completed").text
    assert "/trajectories/a/" in page and "/trajectories/running/" not in page
    assert "/trajectories/running/" in client.get("/trajectories/?status=running").text
    assert "/trajectories/running/" not in client.get("/trajectories/?has_ready=on").text
    # the same number of queries for 2 rows as for 12 (no per-row reads)
    with CaptureQueriesContext(connection) as few:
        client.get("/trajectories/")
    for i in range(10):
        finished(f"more-{i}", seed=i)
    with CaptureQueriesContext(connection) as many:
        assert client.get("/trajectories/").text.count('href="/trajectories/more-') == 10
    assert len(many) == len(few)


def test_trajectory_list_pages_by_keyset(monkeypatch):
    monkeypatch.setattr("curation.selectors.pages.TRAJECTORY_PAGE", 2)
    for i in range(3):
        steps_ingest(steps=[step_in(f"p{i}", 0, prompt=[1], response=[2])])
    client = signed_in("reviewer")
    first = client.get("/trajectories/")
    assert "/trajectories/p2/" in first.text and "/trajectories/p0/" not in first.text
    older = first.context["next_before"]
    second = client.get(f"/trajectories/?before={older}").text
    assert "/trajectories/p0/" in second and "/trajectories/p2/" not in second


# --- curation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"filters": {"readiness": "any"}},
        {"grouping": {"keep_groups_whole": False}},
        {"filters": {"channel": "val"}},
    ],
)
def test_preview_endpoint_returns_the_dataset_preview(spec):
    finished("a")
    finished("b", seed=3)
    steps_ingest(steps=[step_in("running", 0, prompt=[1], response=[2])])
    resp = signed_in("operator").post("/curation/preview", json.dumps(spec), content_type="application/json")
    assert resp.status_code == 200
    assert resp.json() == dataset_preview(spec_parse(spec))


@pytest.mark.parametrize(
    "body,field",
    [
        ({"filters": {"max_staleness": -1}}, "filters.max_staleness"),
        ({"filters": {"bogus": 1}}, "filters.bogus"),
        ({"grouping": {"short_groups": "keep"}}, "grouping.short_groups"),
        ("not json", "spec"),
    ],
)
def test_preview_of_a_bad_spec_is_a_400_naming_the_field(body, field):
    raw = body if isinstance(body, str) else json.dumps(body)
    resp = signed_in("operator").post("/curation/preview", raw, content_type="application/json")
    assert resp.status_code == 400
    assert resp.json()["field"] == field and resp.json()["error"]


BUILDER = {"readiness": "ready", "short_groups": "drop", "exclude_labels": ["rejected", "quarantined"]}


def test_save_a_dataset_then_edit_it_into_version_2():
    client = signed_in("operator")
    # when the operator saves the builder's filters as a dataset
    resp = client.post(
        "/curation/", {**BUILDER, "keep_groups_whole": "on", "name": "math", "description": "d"}
    )
    # then version 1 holds the spec of the fields
    assert resp.status_code == 302 and resp["Location"] == "/curation/datasets/math/"
    ds = Dataset.objects.get(name="math")
    assert ds.current.version == 1 and ds.current.created_by == "operator"
    assert ds.current.spec["grouping"]["keep_groups_whole"] is True
    # when they save the same name with another channel
    client.post("/curation/", {**BUILDER, "channel": "val", "name": "math"})
    # then version 2 is current, and the dataset page lists both with who made them
    ds.refresh_from_db()
    assert ds.current.version == 2 and ds.current.spec["filters"]["channel"] == "val"
    assert ds.current.spec["grouping"]["keep_groups_whole"] is False
    page = client.get("/curation/datasets/math/").text
    assert 'data-version="2"' in page and 'data-version="1"' in page and "created by operator" in page
    # and the builder opens prefilled with the current spec
    form = client.get("/curation/?dataset=math").context["form"]
    assert form.initial["channel"] == "val" and form.initial["name"] == "math"


def test_save_with_the_advanced_json_spec_and_its_errors():
    client = signed_in("operator")
    spec = {"filters": {"tags": ["gold"]}, "grouping": {"min_rollouts": 4}}
    resp = client.post("/curation/", {**BUILDER, "advanced": "on", "spec": json.dumps(spec), "name": "gold"})
    assert resp.status_code == 302
    assert Dataset.objects.get(name="gold").current.spec["grouping"]["min_rollouts"] == 4
    # a bad spec is refused with its field named on the page
    bad = {"filters": {"max_staleness": -2}}
    resp = client.post("/curation/", {**BUILDER, "advanced": "on", "spec": json.dumps(bad), "name": "bad"})
    assert resp.status_code == 400 and "filters.max_staleness" in resp.text
    assert not Dataset.objects.filter(name="bad").exists()


def test_csrf_is_enforced_on_every_post():
    finished("t")
    client = signed_in("operator", csrf=True)
    for url, data in (
        ("/curation/preview", "{}"),
        ("/curation/", {"name": "x"}),
        ("/trajectories/t/", {"action": "accepted"}),
        ("/review/", {"action": "skip", "claim": "1"}),
        ("/review/queues/", {"name": "q"}),
        ("/logout/", {}),
    ):
        kwargs = {"content_type": "application/json"} if isinstance(data, str) else {}
        assert client.post(url, data, **kwargs).status_code == 403, url
    assert not Step.objects.exclude(label="").exists() and not Dataset.objects.exists()
    # with the page's token the same preview is accepted
    client.get("/curation/")
    token = client.cookies["csrftoken"].value
    resp = client.post("/curation/preview", "{}", content_type="application/json", HTTP_X_CSRFTOKEN=token)
    assert resp.status_code == 200


# --- review -------------------------------------------------------------------------------------
def test_review_claims_submits_with_the_author_and_brings_the_next_item():
    finished("first")
    finished("second", seed=1)
    client = signed_in("reviewer")
    # when the reviewer opens /review/
    resp = client.get("/review/")
    # then the oldest item is claimed for them and shown as text
    claim = resp.context["claim"]
    assert claim.trajectory.uid == "first" and "question 0 of first" in resp.text
    # when they submit a rating, a label and a comment
    resp = client.post(
        "/review/", {"action": "submit", "claim": claim.id, "rating": "4", "label": "good", "comment": "fine"}
    )
    assert resp.status_code == 302
    # then the feedback is recorded with them as its author
    fb = Feedback.objects.get()
    assert (fb.trajectory.uid, fb.rating, fb.label, fb.comment, fb.author) == (
        "first",
        4.0,
        "good",
        "fine",
        "reviewer",
    )
    assert fb.user.username == "reviewer"
    # and the next item comes, with the progress counted
    resp = client.get("/review/")
    assert resp.context["claim"].trajectory.uid == "second"
    assert resp.context["progress"]["done"] == 1
    # and the trajectory page shows the feedback
    assert "fine" in client.get("/trajectories/first/").text


def test_a_rating_out_of_range_is_refused_and_the_item_kept():
    finished("t")
    client = signed_in("reviewer")
    claim = client.get("/review/").context["claim"]
    resp = client.post("/review/", {"action": "submit", "claim": claim.id, "rating": "9"})
    assert resp.status_code == 400 and "rating must be between 1 and 5" in resp.text
    assert resp.context["claim"].id == claim.id and not Feedback.objects.exists()


def test_skip_moves_on_and_an_empty_queue_says_what_to_do():
    finished("a")
    finished("b", seed=1)
    client = signed_in("reviewer")
    first = client.get("/review/").context["claim"]
    client.post("/review/", {"action": "skip", "claim": first.id, "trajectory": first.trajectory_id})
    second = client.get("/review/").context["claim"]
    assert second.trajectory_id != first.trajectory_id
    client.post("/review/", {"action": "skip", "claim": second.id, "trajectory": second.trajectory_id})
    # nothing left but skipped items: the empty state, and a way back to them
    resp = client.get("/review/")
    assert resp.context["claim"] is None and "Nothing to review right now" in resp.text
    assert "You skipped 2 items" in resp.text
    client.post("/review/", {"action": "restart"})
    assert client.get("/review/").context["claim"] is not None


def test_an_empty_queue_is_a_friendly_page():
    resp = signed_in("reviewer").get("/review/")
    assert resp.status_code == 200 and "Nothing to review right now" in resp.text


def test_two_reviewers_get_different_items():
    finished("a")
    finished("b", seed=1)
    one = signed_in("reviewer").get("/review/").context["claim"]
    other = Client()
    other.force_login(user_create(username="rita", role="reviewer", password=PASSWORD))
    two = other.get("/review/").context["claim"]
    assert one.trajectory_id != two.trajectory_id


def test_a_queue_that_sets_reward_turns_the_rating_into_a_human_reward():
    finished("t")
    # given an operator creates a queue whose rating is the reward, with label choices
    resp = signed_in("operator").post(
        "/review/queues/",
        {
            "name": "graded",
            "filters": "{}",
            "rating_min": "0",
            "rating_max": "10",
            "label_choices": "correct, wrong",
            "sets_reward": "on",
            "ask_correction": "on",
        },
    )
    assert resp.status_code == 302 and resp["Location"] == "/review/graded/"
    # when a reviewer rates its item 8 of 10
    client = signed_in("reviewer")
    page = client.get("/review/graded/")
    assert 'value="correct"' in page.text and 'name="correction"' in page.text
    claim = page.context["claim"]
    assert (
        client.post("/review/graded/", {"action": "submit", "claim": claim.id, "label": "maybe"}).status_code
        == 400
    )
    resp = client.post(
        "/review/graded/",
        {"action": "submit", "claim": claim.id, "rating": "8", "label": "correct", "correction": "better"},
    )
    assert resp.status_code == 302
    # then the trajectory's reward is 0.8, from a human, audited
    event = RewardEvent.objects.get(reward_source="human")
    assert event.trajectory.uid == "t" and event.new_reward == pytest.approx(0.8)
    assert Trajectory.objects.get(uid="t").reward == pytest.approx(0.8)
    assert ReviewClaim.objects.get(id=claim.id).feedback.correction == "better"
    # and the queue list shows its progress
    assert "1 / 1 done" in client.get("/review/queues/").text


def test_queue_errors_name_the_field():
    client = signed_in("operator")
    resp = client.post("/review/queues/", {"name": "q", "rating_min": "5", "rating_max": "1"})
    assert resp.status_code == 400 and "rating_min must be below rating_max" in resp.text
    # the filters come from the dataset builder's fields, or its advanced JSON spec
    resp = client.post(
        "/review/queues/",
        {
            "name": "q",
            "rating_min": "1",
            "rating_max": "5",
            "advanced": "on",
            "spec": '{"filters": {"x": 1}}',
        },
    )
    assert resp.status_code == 400 and "filters.x" in resp.text


def test_a_reviewer_opening_the_admin_gets_the_sites_403_not_its_sign_in():
    client = signed_in("reviewer")
    # when: a reviewer opens the admin, one of its lists, or its sign-in form
    for path in ("/admin/", "/admin/pool/step/", "/admin/login/"):
        page = client.get(path)
        # then: the site's own "not allowed" page at once, naming them, not a redirect to the
        # admin's sign-in form
        assert page.status_code == 403, path
        assert "data-forbidden" in page.text and "signed in as <strong>reviewer</strong>" in page.text
        assert 'name="password"' not in page.text
    # and anonymous visitors still get the admin's sign-in
    anon = signed_in(None).get("/admin/", follow=True)
    assert anon.status_code == 200 and 'name="password"' in anon.text
