"""The lineage pages (curation/views/consumption.py) through Django's test client on a real database: a
run's page draws its checkpoints on a server-rendered timeline with the mean reward of the
data behind each and lists its sources and tasks; a checkpoint's page lists its leases and
steps and compares with another checkpoint; a step's page lists the checkpoints it trained
and the trainer's verdicts, which the trace shows too; the diff pages of dataset versions
and snapshots count and list what changed. Compared with what was written."""

from __future__ import annotations

import re

import pytest

from curation.services.datasets import dataset_create, dataset_update
from curation.services.snapshots import snapshot_build, snapshot_create
from pool.models import Step
from tests.conftest import client_for
from tests.curation.test_consume import ready_group
from tests.curation.test_lineage import open_run, publish, pull
from tests.curation.test_pages import signed_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def trained(trainer_key):
    """A run of two checkpoints (one group each, rewards 0 and 1 per rollout), a verdict on
    the first group's first step."""
    trainer = client_for(trainer_key)
    dataset_create(name="all", spec={"serving": {"policy_mismatch_kl": 0.1}})
    groups = [ready_group("g0"), ready_group("g1")]
    run = open_run(trainer, name="lineage-run", code_version="abc123")
    for version in (1, 2):
        lease = pull(trainer).json()["lease_id"]
        if version == 1:
            body = {"steps": [{"uid": groups[0][0], "importance_ratio": 1.25, "logprob_kl": 0.5}]}
            assert trainer.post(f"/api/v1/leases/{lease}/verdicts", body, format="json").status_code == 200
        trainer.post(f"/api/v1/leases/{lease}/ack")
        publish(trainer, run["uid"], version)
    return run, groups


def test_a_runs_page_draws_its_checkpoints_with_their_rewards(trained):
    run, groups = trained
    reviewer = signed_in("reviewer")
    page = reviewer.get(f"/runs/{run['uid']}/")
    assert page.status_code == 200
    html = page.content.decode()
    # one point per checkpoint on the timeline, each a link to its page, no script needed
    points = re.findall(r'<a href="(/runs/[^"]+/checkpoints/(\d)/)"><circle class="point"', html)
    assert [v for _, v in points] == ["1", "2"]
    # the table: leases, steps, the mean reward of the data behind each (rollouts 0 and 1)
    rows = re.findall(
        r'data-version="(\d)">.*?data-cell="leases">(\d+)</td><td data-cell="steps">(\d+)</td>'
        r'<td data-cell="reward">([^<]+)</td>',
        html,
        re.S,
    )
    assert rows == [("1", "1", "4", "0.5000"), ("2", "1", "4", "0.5000")]
    assert 'data-fact="steps">8<' in html and "abc123" in html
    assert re.search(r'id="sources">.*?: 8 steps</li>', html, re.S)
    # and the runs list and the consumption page link to it
    assert f'href="/runs/{run["uid"]}/"' in reviewer.get("/runs/").content.decode()
    assert f'href="/runs/{run["uid"]}/"' in reviewer.get("/consumption/").content.decode()


def test_a_checkpoints_page_lists_its_steps_and_compares(trained):
    run, groups = trained
    page = signed_in("reviewer").get(f"/runs/{run['uid']}/checkpoints/1/?to=2").content.decode()
    listed = re.findall(r'<tr data-step="([^"]+)">', page)
    assert listed == groups[0]
    ids = dict(Step.objects.filter(uid__in=groups[0]).values_list("uid", "id"))
    assert all(f'href="/steps/{ids[u]}/"' in page for u in groups[0])
    assert re.search(r"<strong>4</strong> steps added, <strong>4</strong> removed, 0 in both", page)
    download = f"/runs/{run['uid']}/checkpoints/1/steps.txt"
    assert download in page
    got = signed_in("operator").get(download)
    assert b"".join(got.streaming_content).decode().splitlines() == groups[0]


def test_a_steps_page_lists_its_checkpoints_and_verdicts_and_the_trace_shows_them(trained):
    run, groups = trained
    step = Step.objects.get(uid=groups[0][0])
    reviewer = signed_in("reviewer")
    page = reviewer.get(f"/steps/{step.id}/").content.decode()
    assert f'data-checkpoint="{run["uid"]}@1"' in page
    assert re.search(r'data-verdict="importance_ratio">1.25<', page)
    assert re.search(r'data-verdict="logprob_kl">0.5<', page)
    assert "policy_mismatch" in page  # flagged: 0.5 is above the dataset's 0.1
    trace = reviewer.get(f"/trajectories/{step.trajectory.uid}/").content.decode()
    assert re.search(r'data-verdict="importance_ratio"[^>]*>ratio 1.250<', trace)
    assert re.search(r'data-verdict="logprob_kl"[^>]*>KL 0.5000<', trace)
    other = Step.objects.get(uid=groups[1][0])
    assert f'data-checkpoint="{run["uid"]}@2"' in reviewer.get(f"/steps/{other.id}/").content.decode()


def test_the_diff_pages_count_and_list_what_changed(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    g0 = ready_group("g0")
    dataset_create(name="d")
    dataset_update(name="d", spec={"filters": {"reward_min": 0.5}, "grouping": {"keep_groups_whole": False}})
    page = signed_in("operator").get("/curation/datasets/d/diff?side=removed").content.decode()
    assert re.search(r'data-count="removed">2<', page) and re.search(r'data-count="kept">2<', page)
    assert re.findall(r'<tr data-step="([^"]+)">', page) == [u for u in g0 if "-r0:" in u]
    reviewer = signed_in("reviewer")
    assert reviewer.get("/curation/datasets/d/diff").status_code == 403
    first = snapshot_create(dataset="d")
    snapshot_build(snapshot_id=first.id)
    g1 = ready_group("g1")
    second = snapshot_create(dataset="d")
    snapshot_build(snapshot_id=second.id)
    page = reviewer.get(f"/consumption/snapshots/{second.id}/diff").content.decode()
    assert re.search(r'data-count="added">2<', page)
    assert sorted(re.findall(r'<tr data-step="([^"]+)">', page)) == sorted(u for u in g1 if "-r1:" in u)
