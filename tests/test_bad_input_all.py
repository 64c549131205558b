"""Bad input on every endpoint, beyond the step batches of tests/gateway/test_bad_input.py:
syntax, types, ranges, sizes, encodings, unknown ids, replayed ids, wrong content types and
wrong methods. Every request gets a 4xx JSON error (never a 5xx, never an HTML page) and no
row changes anywhere.

Callers hold an admin key (every scope), so what is refused is the input, not the caller;
a few cases check the callers themselves.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from django.test import Client

from curation.models import (
    Checkpoint,
    CheckpointStep,
    Consumer,
    Dataset,
    DatasetVersion,
    LabelEvent,
    Lease,
    Run,
    Snapshot,
    StepVerdict,
)
from curation.services.consume import PullIn, consumer_pull, lease_ack, lease_nack
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.models import ApiKey, AuditEvent, Media, MergeResult, StepMedia
from pool.services.api_keys import api_key_create
from tests.pool.factories import pool_counts, step_in

pytestmark = pytest.mark.django_db

T, S, G, D = "bad-all-t", "bad-all-t:0", "bad-all-g", "bad-all-ds"
NO_LEASE = "00000000-0000-4000-8000-000000000000"
LONG = "x" * 5000
A = "/api/v1"


def j(obj: Any) -> dict:
    return {"data": json.dumps(obj), "content_type": "application/json"}


def raw(body: bytes, content_type: str = "application/json") -> dict:
    return {"data": body, "content_type": content_type}


# (id, method, path, request kwargs, caller)  -- "{lease}" / "{acked}" / "{snapshot}" are
# filled in from the seeded rows.
CASES: list[tuple[str, str, str, dict, str]] = [
    # --- syntax and encodings -----------------------------------------------------------------
    ("trajectories: truncated JSON", "post", f"{A}/trajectories", raw(b'{"uid": "x"'), "admin"),
    ("trajectories: not UTF-8", "post", f"{A}/trajectories", raw(b'{"uid": "\xff\xfe"}'), "admin"),
    ("trajectories: overlong UTF-8", "post", f"{A}/trajectories", raw(b'{"uid": "\xc0\xaf"}'), "admin"),
    ("groups: trailing garbage", "post", f"{A}/groups", raw(b'{"uid": "g"} xx'), "admin"),
    (
        "rewards: NaN literal",
        "post",
        f"{A}/rewards",
        raw(b'{"step_uid": "%s", "reward": NaN}' % S.encode()),
        "admin",
    ),
    (
        "rewards: Infinity literal",
        "post",
        f"{A}/rewards",
        raw(b'{"step_uid": "%s", "reward": Infinity}' % S.encode()),
        "admin",
    ),
    ("events: empty body", "post", f"{A}/events", raw(b""), "admin"),
    ("feedback: JSON null", "post", f"{A}/feedback", raw(b"null"), "admin"),
    ("datasets: JSON string", "post", f"{A}/datasets", raw(b'"a dataset"'), "admin"),
    ("labels: truncated", "post", f"{A}/labels", raw(b'{"step_uids": ['), "admin"),
    (
        "policy-versions: lone surrogate",
        "post",
        f"{A}/policy-versions",
        raw(b'{"version": 3, "metadata": {"a": "\\ud800"}}'),
        "admin",
    ),
    # --- wrong content types --------------------------------------------------------------------
    (
        "trajectories: form-encoded",
        "post",
        f"{A}/trajectories",
        raw(b"uid=x", "application/x-www-form-urlencoded"),
        "admin",
    ),
    ("groups: text/plain", "post", f"{A}/groups", raw(b'{"uid": "g2"}', "text/plain"), "admin"),
    ("rewards: XML", "post", f"{A}/rewards", raw(b"<reward/>", "application/xml"), "admin"),
    (
        "datasets: multipart",
        "post",
        f"{A}/datasets",
        raw(b"--b\r\n\r\n--b--", "multipart/form-data; boundary=b"),
        "admin",
    ),
    (
        "pull: form-encoded",
        "post",
        f"{A}/consumers/c1/pull",
        raw(b"dataset=x", "application/x-www-form-urlencoded"),
        "admin",
    ),
    ("snapshots: text/csv", "post", f"{A}/snapshots", raw(b"dataset\nx", "text/csv"), "admin"),
    # --- types ------------------------------------------------------------------------------------
    ("trajectories: uid is an object", "post", f"{A}/trajectories", j({"uid": {"a": 1}}), "admin"),
    ("trajectories: body is a list", "post", f"{A}/trajectories", j([{"uid": "l"}]), "admin"),
    (
        "complete: reward is a string",
        "post",
        f"{A}/trajectories/{T}/complete",
        j({"reward": "high"}),
        "admin",
    ),
    (
        "completions: not a list",
        "post",
        f"{A}/trajectory-completions",
        j({"completions": {"uid": T}}),
        "admin",
    ),
    (
        "groups: expected_rollouts is text",
        "post",
        f"{A}/groups",
        j({"uid": "g3", "expected_rollouts": "four"}),
        "admin",
    ),
    ("rewards: reward is a list", "post", f"{A}/rewards", j({"step_uid": S, "reward": [1]}), "admin"),
    (
        "rewards: list of rewards with a bad one",
        "post",
        f"{A}/rewards",
        j({"rewards": [{"step_uid": S, "reward": 1.0}, {"step_uid": S, "reward": "x"}]}),
        "admin",
    ),
    ("events: type is an object", "post", f"{A}/events", j({"type": {"a": 1}, "step_uid": S}), "admin"),
    ("feedback: rating is text", "post", f"{A}/feedback", j({"step_uid": S, "rating": "great"}), "admin"),
    ("policy-versions: version is text", "post", f"{A}/policy-versions", j({"version": "v5"}), "admin"),
    (
        "policy-versions: current is a string",
        "post",
        f"{A}/policy-versions",
        j({"version": 9, "current": "maybe"}),
        "admin",
    ),
    ("datasets: filters is a list", "post", f"{A}/datasets", j({"name": "new-ds", "filters": [1]}), "admin"),
    ("datasets: name is a number", "post", f"{A}/datasets", j({"name": 7}), "admin"),
    ("dataset patch: filters is text", "patch", f"{A}/datasets/{D}", j({"filters": "all"}), "admin"),
    (
        "dataset put: unknown filter",
        "put",
        f"{A}/datasets/{D}",
        j({"filters": {"no_such_filter": 1}}),
        "admin",
    ),
    ("preview: filters is a number", "post", f"{A}/datasets/preview", j({"filters": 3}), "admin"),
    ("preview: exact is text", "post", f"{A}/datasets/preview", j({"exact": "yes"}), "admin"),
    (
        "labels: step_uids is a string",
        "post",
        f"{A}/labels",
        j({"step_uids": S, "label": "accepted"}),
        "admin",
    ),
    ("labels: unknown label", "post", f"{A}/labels", j({"step_uids": [S], "label": "brilliant"}), "admin"),
    ("pull: dataset is a list", "post", f"{A}/consumers/c1/pull", j({"dataset": [D]}), "admin"),
    ("snapshots: dataset is null", "post", f"{A}/snapshots", j({"dataset": None}), "admin"),
    # --- ranges and sizes -------------------------------------------------------------------------
    ("trajectories: empty uid", "post", f"{A}/trajectories", j({"uid": ""}), "admin"),
    ("trajectories: 5000-char uid", "post", f"{A}/trajectories", j({"uid": LONG}), "admin"),
    (
        "groups: negative expected_rollouts",
        "post",
        f"{A}/groups",
        j({"uid": "g4", "expected_rollouts": -1}),
        "admin",
    ),
    (
        "groups: huge expected_rollouts",
        "post",
        f"{A}/groups",
        j({"uid": "g5", "expected_rollouts": 10**30}),
        "admin",
    ),
    ("policy-versions: negative", "post", f"{A}/policy-versions", j({"version": -3}), "admin"),
    ("policy-versions: 2**70", "post", f"{A}/policy-versions", j({"version": 2**70}), "admin"),
    (
        "rewards: 1e400",
        "post",
        f"{A}/rewards",
        raw(b'{"step_uid": "%s", "reward": 1e400}' % S.encode()),
        "admin",
    ),
    ("pull: zero batch size", "post", f"{A}/consumers/c1/pull", j({"dataset": D, "batch_size": 0}), "admin"),
    (
        "pull: negative lease seconds",
        "post",
        f"{A}/consumers/c1/pull",
        j({"dataset": D, "lease_seconds": -5}),
        "admin",
    ),
    ("datasets: name with a slash", "post", f"{A}/datasets", j({"name": "a/b"}), "admin"),
    ("datasets: 5000-char name", "post", f"{A}/datasets", j({"name": LONG}), "admin"),
    ("steps list: policy_version is text", "get", f"{A}/steps?policy_version=abc", {}, "admin"),
    ("steps list: created_after is no date", "get", f"{A}/steps?created_after=yesterday", {}, "admin"),
    (
        "steps list: created_after past year 9999 in UTC",
        "get",
        f"{A}/steps?created_after=9999-12-31T23:00:00-05:00",
        {},
        "admin",
    ),
    (
        "preview: created_after past year 9999 in UTC",
        "post",
        f"{A}/datasets/preview",
        j({"filters": {"created_after": "9999-12-31T23:00:00-05:00"}}),
        "admin",
    ),
    ("trajectories list: bad status filter", "get", f"{A}/trajectories?status=flying", {}, "admin"),
    # --- unknown ids -------------------------------------------------------------------------------
    ("step: unknown uid", "get", f"{A}/steps/no-such-step", {}, "admin"),
    ("trajectory: unknown uid", "get", f"{A}/trajectories/no-such-traj", {}, "admin"),
    (
        "complete: unknown trajectory",
        "post",
        f"{A}/trajectories/no-such-traj/complete",
        j({"reward": 1.0}),
        "admin",
    ),
    ("group: unknown uid", "get", f"{A}/groups/no-such-group", {}, "admin"),
    ("prefix tree: unknown group", "get", f"{A}/groups/no-such-group/prefix-tree", {}, "admin"),
    ("rewards: unknown step", "post", f"{A}/rewards", j({"step_uid": "no-such:0", "reward": 1.0}), "admin"),
    ("feedback: unknown step", "post", f"{A}/feedback", j({"step_uid": "no-such:0", "rating": 1.0}), "admin"),
    (
        "labels: unknown step",
        "post",
        f"{A}/labels",
        j({"step_uids": ["no-such:0"], "label": "accepted"}),
        "admin",
    ),
    ("dataset: unknown name", "get", f"{A}/datasets/no-such-ds", {}, "admin"),
    ("dataset patch: unknown name", "patch", f"{A}/datasets/no-such-ds", j({"filters": {}}), "admin"),
    ("dataset preview: unknown name", "get", f"{A}/datasets/no-such-ds/preview", {}, "admin"),
    ("pull: unknown dataset", "post", f"{A}/consumers/c1/pull", j({"dataset": "no-such-ds"}), "admin"),
    ("consumer: unknown name", "get", f"{A}/consumers/no-such-consumer", {}, "admin"),
    ("ack: unknown lease", "post", f"{A}/leases/{NO_LEASE}/ack", {}, "admin"),
    ("nack: unknown lease", "post", f"{A}/leases/{NO_LEASE}/nack", {}, "admin"),
    ("batch: unknown lease", "get", f"{A}/leases/{NO_LEASE}/batch", {}, "admin"),
    ("lease: not a UUID", "post", f"{A}/leases/not-a-uuid/ack", {}, "admin"),
    ("snapshot: unknown id", "get", f"{A}/snapshots/{NO_LEASE}", {}, "admin"),
    ("snapshot download: unknown id", "get", f"{A}/snapshots/{NO_LEASE}/download", {}, "admin"),
    ("snapshots: unknown dataset", "post", f"{A}/snapshots", j({"dataset": "no-such-ds"}), "admin"),
    ("unknown API route", "get", f"{A}/no-such-endpoint", {}, "admin"),
    # --- replayed ids ------------------------------------------------------------------------------
    ("datasets: existing name", "post", f"{A}/datasets", j({"name": D}), "admin"),
    ("ack: a released lease", "post", f"{A}/leases/{{released}}/ack", {}, "admin"),
    ("nack: an acked lease", "post", f"{A}/leases/{{acked}}/nack", {}, "admin"),
    # --- wrong methods -----------------------------------------------------------------------------
    ("steps: DELETE", "delete", f"{A}/steps", {}, "admin"),
    ("step: PUT", "put", f"{A}/steps/{S}", j({}), "admin"),
    ("trajectory: DELETE", "delete", f"{A}/trajectories/{T}", {}, "admin"),
    ("complete: GET", "get", f"{A}/trajectories/{T}/complete", {}, "admin"),
    ("stats: POST", "post", f"{A}/stats", j({}), "admin"),
    ("datasets: DELETE", "delete", f"{A}/datasets/{D}", {}, "admin"),
    ("labels: GET", "get", f"{A}/labels", {}, "admin"),
    ("pull: GET", "get", f"{A}/consumers/c1/pull", {}, "admin"),
    ("ack: GET", "get", f"{A}/leases/{{lease}}/ack", {}, "admin"),
    ("snapshot: DELETE", "delete", f"{A}/snapshots/{{snapshot}}", {}, "admin"),
    ("readyz: POST", "post", "/readyz", {}, "anonymous"),
    ("metrics: POST", "post", "/metrics", {}, "admin"),
    # --- callers -------------------------------------------------------------------------------
    ("malformed Authorization", "get", f"{A}/stats", {"HTTP_AUTHORIZATION": "Token abc"}, "anonymous"),
    ("key of another format", "get", f"{A}/stats", {"HTTP_AUTHORIZATION": "Bearer sk-123"}, "anonymous"),
    ("reader writes a trajectory", "post", f"{A}/trajectories", j({"uid": "r-t"}), "read"),
    ("ingest key creates a dataset", "post", f"{A}/datasets", j({"name": "i-ds"}), "ingest"),
    ("metrics with an ingest key", "get", "/metrics", {}, "ingest"),
    # --- media (issue 24) ----------------------------------------------------------------------
    ("media: not an image", "post", f"{A}/media", raw(b"plain text", "image/png"), "ingest"),
    (
        "media: SVG with script",
        "post",
        f"{A}/media",
        raw(b"<svg><script>1</script></svg>", "image/svg+xml"),
        "ingest",
    ),
    ("media: unknown sha256", "get", f"{A}/media/{'0' * 64}", {}, "read"),
    ("media: upload with a read key", "post", f"{A}/media", raw(b"\x89PNG", "image/png"), "read"),
    # --- tasks and the task sampler ----------------------------------------------------------------
    ("tasks: truncated JSON", "post", f"{A}/tasks", raw(b'{"tasks": ['), "admin"),
    ("tasks: uid is a number", "post", f"{A}/tasks", j({"tasks": [{"uid": 7}]}), "admin"),
    ("tasks list: pass_rate_min is text", "get", f"{A}/tasks?pass_rate_min=high", {}, "admin"),
    ("tasks list: unknown sort", "get", f"{A}/tasks?sort=colour", {}, "admin"),
    ("task-sampler: n is text", "post", f"{A}/task-sampler", j({"n": "64", "strategy": "uniform"}), "admin"),
    (
        "task-sampler: unknown filter",
        "post",
        f"{A}/task-sampler",
        j({"strategy": "uniform", "tasks": {"x": 1}}),
        "admin",
    ),
    ("task-sampler records: bad cursor", "get", f"{A}/task-sampler/records?cursor=zz", {}, "admin"),
    # --- lineage: runs, checkpoints, the other way ------------------------------------------------
    (
        "runs: config is a list",
        "post",
        f"{A}/runs",
        j({"consumer": "c1", "dataset": D, "config": [1]}),
        "admin",
    ),
    ("runs: unknown dataset", "post", f"{A}/runs", j({"consumer": "c1", "dataset": "no-such-ds"}), "admin"),
    (
        "runs: uid with a slash",
        "post",
        f"{A}/runs",
        j({"consumer": "c1", "dataset": D, "uid": "a/b"}),
        "admin",
    ),
    ("runs list: bad cursor", "get", f"{A}/runs?cursor=zz", {}, "admin"),
    ("runs list: page_size 0", "get", f"{A}/runs?page_size=0", {}, "admin"),
    ("run: unknown uid", "get", f"{A}/runs/no-such-run", {}, "admin"),
    ("checkpoint: unknown run", "get", f"{A}/runs/no-such-run/checkpoints/1", {}, "admin"),
    ("replay: unknown run", "get", f"{A}/runs/no-such-run/replay", {}, "admin"),
    (
        "policy-versions: unknown run",
        "post",
        f"{A}/policy-versions",
        j({"version": 5, "run": "no-such-run"}),
        "admin",
    ),
    (
        "policy-versions: run is a number",
        "post",
        f"{A}/policy-versions",
        j({"version": 5, "run": 7}),
        "admin",
    ),
    ("verdicts: steps is not a list", "post", f"{A}/leases/{{lease}}/verdicts", j({"steps": {}}), "admin"),
    (
        "verdicts: unknown lease",
        "post",
        f"{A}/leases/{NO_LEASE}/verdicts",
        j({"steps": [{"uid": S}]}),
        "admin",
    ),
    (
        "verdicts: a released lease",
        "post",
        f"{A}/leases/{{released}}/verdicts",
        j({"steps": [{"uid": S}]}),
        "admin",
    ),
    ("dataset diff: from is text", "get", f"{A}/datasets/{D}/diff?from=one&to=1", {}, "admin"),
    ("snapshot diff: not done", "get", f"{A}/snapshots/{{snapshot}}/diff?to={{snapshot}}", {}, "admin"),
    ("step checkpoints: unknown step", "get", f"{A}/steps/no-such-step/checkpoints", {}, "admin"),
    ("source checkpoints: unknown source", "get", f"{A}/sources/no-such-source/checkpoints", {}, "admin"),
]


@pytest.fixture
def seeded(db, settings, tmp_path) -> dict[str, str]:
    settings.MEDIA_ROOT = tmp_path / "media"
    steps_ingest(steps=[step_in(T, 0, prompt=[1, 2, 3], response=[4, 5], group=G)])
    steps_ingest(steps=[step_in("bad-all-r1", 0, prompt=[1], response=[2], reward=1.0, is_last=True)])
    steps_ingest(steps=[step_in("bad-all-r2", 0, prompt=[3], response=[4], reward=1.0, is_last=True)])
    dataset_create(name=D)
    acked = consumer_pull(consumer="seed", pull=PullIn(dataset=D, batch_size=1))
    lease_ack(lease_id=acked.id)
    released = consumer_pull(consumer="seed", pull=PullIn(dataset=D, batch_size=1))
    lease_nack(lease_id=released.id)
    lease = consumer_pull(consumer="seed", pull=PullIn(dataset=D, batch_size=1))
    from curation.services.snapshots import snapshot_create

    snapshot = snapshot_create(dataset=D)
    return {
        "lease": str(lease.id),
        "acked": str(acked.id),
        "released": str(released.id),
        "snapshot": str(snapshot.id),
    }


def every_count() -> dict[str, int]:
    models = (Dataset, DatasetVersion, LabelEvent, Lease, Snapshot, Consumer, ApiKey, AuditEvent, MergeResult)
    models += (Media, StepMedia)  # issue 24
    models += (Run, Checkpoint, CheckpointStep, StepVerdict)  # lineage
    return {**pool_counts(), **{m.__name__: m.objects.count() for m in models}}


def client_as(caller: str) -> Client:
    client = Client()
    if caller != "anonymous":
        _, key = api_key_create(name=f"bad-{caller}-{uuid.uuid4().hex[:6]}", scopes=[caller])
        client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    return client


def test_there_are_at_least_sixty_cases_covering_every_api_route():
    from tests.gateway.test_schema import api_routes

    assert len(CASES) >= 60
    assert len({c[0] for c in CASES}) == len(CASES)
    paths = {c[2].split("?")[0] for c in CASES}
    for route in api_routes():
        pattern = (
            route.replace("{uid}", "")
            .replace("{name}", "")
            .replace("{lease_id}", "")
            .replace("{snapshot_id}", "")
            .replace("{sha256}", "")
        )
        prefix = pattern.split("//")[0].rstrip("/")
        assert any(p.startswith(prefix) for p in paths), route


@pytest.mark.parametrize(("case", "method", "path", "kwargs", "caller"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_4xx_json_error_and_writes_nothing(seeded, case, method, path, kwargs, caller):
    # given the seeded pool and a caller
    client = client_as(caller)
    before = every_count()
    # when the malformed request is sent
    kwargs = dict(kwargs)
    data = kwargs.pop("data", None)
    content_type = kwargs.pop("content_type", None)
    call = getattr(client, method)
    args = {"data": data, "content_type": content_type} if data is not None else {}
    resp = call(path.format(**seeded), **args, **kwargs)
    # then a 4xx error in the JSON shape, and no row changed anywhere
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.content[:300])
    assert resp["Content-Type"].startswith("application/json"), resp.content[:200]
    error = resp.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert every_count() == before
