"""The tasks page (/tasks/): bucket counts equal to the API's, the histogram, the table, and
its live refresh endpoint; login and role required."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from pool.models import Task
from pool.services.task_catalog import TaskIn, tasks_register
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

RATES = [None, None, 0.0, 0.05, 0.3, 0.5, 0.5, 0.7, 0.95, 1.0, 1.0]  # by task


def _seed() -> None:
    tasks_register(tasks=[TaskIn(uid=f"t{i}", set_name="math") for i in range(len(RATES))])
    tasks_register(tasks=[TaskIn(uid="other", set_name="code")])
    for i, rate in enumerate(RATES):
        if rate is not None:
            p = (rate * 8 + 1) / 10
            Task.objects.filter(uid=f"t{i}").update(
                pass_rate=rate, seen=1, rewarded=8, reward_sum=rate * 8, recent_pass_rate=p, score=p * (1 - p)
            )


def test_the_page_counts_equal_the_api_and_the_histogram_adds_up(operator, admin_key):
    # given tasks across the buckets
    _seed()
    page = Client()
    page.force_login(operator)
    api = client_for(admin_key)
    # when the page and its live counts are read, for one set
    html = page.get("/tasks/?set=math").content.decode()
    counts = page.get("/tasks/?set=math&format=json").json()
    # then each bucket's count is the API's count of that bucket
    for bucket in ("solved", "hopeless", "informative", "unseen"):
        n = len(api.get(f"/api/v1/tasks?set=math&bucket={bucket}&page_size=1000").json()["results"])
        assert counts["buckets"][bucket] == n, bucket
        assert re.search(rf'data-bucket="{bucket}">{n}<', html), bucket
    assert counts["buckets"] == {"total": 11, "solved": 3, "hopeless": 2, "informative": 4, "unseen": 2}
    # and the histogram holds every seen task once, in its bin
    bins = [b["count"] for b in counts["bins"]]
    assert bins == [2, 0, 0, 1, 0, 2, 0, 1, 0, 3]
    assert sum(bins) == 9
    # and the table lists the seen tasks, the most informative first
    rows = re.findall(r'data-task="([^"]+)"', html)
    assert rows[:2] in (["t5", "t6"], ["t6", "t5"]) and set(rows) == {f"t{i}" for i in range(2, 11)}
    # and the nav links the page
    assert 'href="/tasks/" aria-current="page">Tasks<' in html


def test_each_row_names_its_bucket_beside_its_mixed_groups(operator, admin_key):
    # given a hopeless task (pass rate 0.05) three of whose groups had mixed rewards
    _seed()
    Task.objects.filter(uid="t3").update(informative_groups=3)
    page = Client()
    page.force_login(operator)
    # when the table is read
    html = page.get("/tasks/?set=math").content.decode()
    row = re.search(r'<tr data-task="t3">(.*?)</tr>', html, re.S).group(1)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    header = re.findall(r"<th>([^<]+)</th>", html)
    shown = dict(zip(header, cells, strict=True))
    # then the row says hopeless, as the API's bucket filter does, and counts its mixed groups
    # under a name that is not a bucket's
    api = client_for(admin_key).get("/api/v1/tasks?set=math&bucket=hopeless&page_size=100").json()
    assert "t3" in [t["uid"] for t in api["results"]]
    assert shown["Bucket"] == "hopeless" and shown["Groups with mixed rewards"] == "3"
    assert "Informative groups" not in html
    # and every row's bucket is the one the API files it under
    for bucket in ("solved", "hopeless", "informative"):
        uids = {
            t["uid"]
            for t in client_for(admin_key).get(f"/api/v1/tasks?set=math&bucket={bucket}").json()["results"]
        }
        assert uids == set(
            re.findall(rf'<tr data-task="([^"]+)">(?:(?!</tr>).)*data-task-bucket="{bucket}"', html, re.S)
        )


def test_the_page_needs_a_login():
    resp = Client().get("/tasks/")
    assert resp.status_code == 302 and "/login/" in resp["Location"]


def test_the_admin_lists_tasks_sets_and_sampler_records(operator, agent):
    # given tasks and one sampler answer
    _seed()
    assert (
        agent.post(
            "/api/v1/task-sampler", {"n": 2, "strategy": "uniform", "seed": 1}, format="json"
        ).status_code
        == 200
    )
    page = Client()
    page.force_login(operator)
    # then each admin list shows them
    assert "t5" in page.get("/admin/pool/task/?q=t5").content.decode()
    assert "math" in page.get("/admin/pool/taskset/").content.decode()
    assert "uniform" in page.get("/admin/pool/tasksamplerecord/").content.decode()
