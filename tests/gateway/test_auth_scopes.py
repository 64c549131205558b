"""The scopes matrix: every /api/v1 endpoint against every kind of caller.

Writes need the ingest scope (policy versions: the policy scope); curation writes (datasets,
labels) and releasing any lease the admin scope; reads are open to ingest, consume, read and
admin keys; admin keys and staff signed in (operators)
may do everything; anonymous callers get 401 with a Bearer challenge; a signed-in non-staff
user (a reviewer) gets 403: reviewers work in the pages, not the API.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from curation.models import Dataset, DatasetVersion, LabelEvent, Lease, Snapshot
from curation.services.consume import Actor, PullIn, consumer_pull
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.models import Scope, Source, Step
from pool.services.api_keys import api_key_create
from tests.conftest import client_for, make_step, rolled_back_world
from tests.pool.factories import pool_counts, step_in

pytestmark = pytest.mark.django_db

S, T, G, D = "seed-t:0", "seed-t", "seed-g", "seed-ds"
SEED = "seed-source"

WRITES = [
    ("steps", {"steps": [make_step("new-t", 0, prompt=[1, 2, 3], response=[4])]}),
    ("trajectories", {"uid": "new-t2"}),
    (f"trajectories/{T}/complete", {"reward": 1.0}),
    ("groups", {"uid": "new-g", "expected_rollouts": 4}),
    ("rewards", {"step_uid": S, "reward": 0.5}),
    ("events", {"type": "tool_call", "step_uid": S}),
    ("feedback", {"step_uid": S, "rating": 1.0, "label": "good"}),
    ("policy-versions", {"version": 5}),
    ("trajectory-completions", {"completions": [{"uid": T}]}),
    ("tasks", {"tasks": [{"uid": "new-task", "set": "s"}]}),
]
# Curation writes: admin keys and operators only. (method, endpoint, body)
CURATE = [
    ("post", "datasets", {"name": "new-ds", "filters": {"channel": "val"}}),
    ("patch", f"datasets/{D}", {"filters": {"max_staleness": 3}}),
    ("put", f"datasets/{D}", {"filters": {"max_staleness": 4}}),
    ("post", "labels", {"step_uids": [S], "label": "accepted"}),
]
# Consumption: consume keys (trainers), admin keys and operators only; releasing any
# consumer's lease: admin keys and operators. The lease is the seeded one (LEASE is filled in
# by the seeded fixture), of a consumer of the consume caller's source (others' consumers
# are 404s: tests/curation/test_ownership.py).
CONSUME = [
    ("post", "consumers/trainer-x/pull", {"dataset": D}),
    ("post", "leases/{lease}/ack", None),
    ("post", "leases/{lease}/nack", None),
    ("post", "leases/{lease}/release", None),
    ("get", "leases/{lease}/batch", None),
    ("get", "consumers/seed", None),
]
# Snapshots: creating one (a build) is for trainers (consume keys), admin keys and operators;
# its status and files are reads (any key). SNAPSHOT is filled in by the snapshot fixture.
SNAPSHOT_CREATE = [("post", "snapshots", {"dataset": D})]
SNAPSHOT_READS = [
    "snapshots/{snapshot}",
    "snapshots/{snapshot}/download",
    "snapshots/{snapshot}/diff?to={snapshot}",
]
# Reads sent as POST (a spec in the body).
READ_POSTS = [
    ("datasets/preview", {"filters": {}}),
    ("task-sampler", {"n": 4, "strategy": "uniform"}),  # a read of tasks, its answer recorded
]
READS = [
    "steps",
    f"steps/{S}",
    "trajectories",
    f"trajectories/{T}",
    "groups",
    f"groups/{G}",
    "events",
    "feedback",
    "policy-versions",
    "stats",
    f"groups/{G}/prefix-tree",
    "datasets",
    f"datasets/{D}",
    f"datasets/{D}/preview",
    f"datasets/{D}/diff?from=1&to=1",
    "tasks",
    "task-sampler/records",
]
# Lineage reads (any key): a run of the seed source with checkpoint 1 (the lineage fixture).
RUN = "run-seed"
LINEAGE_READS = [
    "runs",
    f"runs/{RUN}",
    f"runs/{RUN}/checkpoints",
    f"runs/{RUN}/checkpoints/1",
    f"runs/{RUN}/checkpoints/1/diff?to=1",
    f"runs/{RUN}/checkpoints/1/steps",
    f"runs/{RUN}/checkpoints/1/steps/download",
    f"runs/{RUN}/checkpoints/1/trajectories",
    "steps/seed-lin:0/checkpoints",
    "trajectories/seed-lin/checkpoints",
    f"sources/{SEED}/checkpoints",
]
# Lineage for trainers (consume keys, admin keys, operators): opening a run, replaying the
# consume caller's run, verdicts on its lease. (method, endpoint, body)
TRAINER_RUN = "run-trainer"
LINEAGE_CONSUME = [
    ("post", "runs", {"consumer": "seed", "dataset": D}),
    ("get", f"runs/{TRAINER_RUN}/replay", None),
    ("post", "leases/{lease}/verdicts", {"steps": [{"uid": "seed-ready:0", "importance_ratio": 1.0}]}),
]

# caller -> (may write, may read)
CALLERS = {
    "ingest": (True, True),
    "consume": (False, True),
    "read": (False, True),
    "policy": (False, False),  # policy versions only (test_write_matrix)
    "admin": (True, True),
    "operator": (True, True),
    "non-staff-user": (False, False),
    "anonymous": (False, False),
}


@pytest.fixture(scope="module")
def seeded_built(django_db_setup, django_db_blocker):
    """``seeded``'s pool, written once for the module and rolled back after its last test."""
    with rolled_back_world(django_db_blocker, seed_pool) as lease:
        yield lease


@pytest.fixture
def seeded(seeded_built, db) -> str:
    """The pool every caller meets, written by the source SEED that every caller's key is
    granted (so this matrix tests scopes alone; tenancy: tests/test_tenancy_matrix.py);
    returns the id of a lease on one ready trajectory. What a test writes is rolled back
    after it (``rolled_back_world``)."""
    return seeded_built


def seed_pool() -> str:
    seed = Source.objects.create(name=SEED).id
    steps_ingest(steps=[step_in(T, 0, prompt=[1, 2, 3], response=[4, 5], group=G)], source_id=seed)
    dataset_create(name=D)
    steps_ingest(
        steps=[step_in("seed-ready", 0, prompt=[1], response=[2], reward=1.0, is_last=True)], source_id=seed
    )
    owner = Source.objects.create(name="caller-consume")  # the consume caller's key's source
    lease = consumer_pull(consumer="seed", pull=PullIn(dataset=D), actor=Actor(source_id=owner.id))
    assert lease is not None
    return str(lease.id)


def curation_counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in (Dataset, DatasetVersion, LabelEvent)}


def caller_client(kind: str, django_user_model) -> APIClient:
    if kind in (Scope.INGEST, Scope.CONSUME, Scope.READ, Scope.POLICY, Scope.ADMIN):
        return client_for(api_key_create(name=f"caller-{kind}", scopes=[kind], extra_sources=[SEED])[1])
    client = APIClient()
    if kind == "operator":
        client.force_login(django_user_model.objects.create_superuser("op", "op@example.com", "pw"))
    elif kind == "non-staff-user":
        client.force_login(django_user_model.objects.create_user("viewer", "v@example.com", "pw"))
    return client


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("endpoint", "body"), WRITES, ids=[w[0] for w in WRITES])
def test_write_matrix(seeded, django_user_model, caller, endpoint, body):
    # given a caller of this kind
    client = caller_client(caller, django_user_model)
    may_write, _ = CALLERS[caller]
    if endpoint == "policy-versions":
        # trainers publish the policy versions they train: the policy scope (trainer keys
        # hold consume + policy), never ingest or consume alone
        may_write = caller in ("policy", "admin", "operator")
    before = pool_counts()
    # when it posts to a write endpoint
    resp = client.post(f"/api/v1/{endpoint}", body, format="json")
    # then it succeeds only with the ingest scope (or admin/operator); otherwise nothing is written
    if may_write:
        assert resp.status_code in (200, 201), resp.content
    else:
        expected = 401 if caller == "anonymous" else 403
        assert resp.status_code == expected, resp.content
        assert resp.json()["error"]["type"] == (
            "authentication_error" if expected == 401 else "permission_error"
        )
        if expected == 401:
            assert resp["WWW-Authenticate"].startswith("Bearer")
        else:  # the refusal names who lacks the scope: a key, or a signed-in account
            who = "this account" if caller == "non-staff-user" else "this API key"
            assert resp.json()["error"]["message"].startswith(f"{who} lacks the "), resp.content
        assert pool_counts() == before


@pytest.mark.parametrize("caller", ["read", "non-staff-user", "anonymous"])
def test_a_caller_without_the_scope_is_refused_before_its_body_is_read(seeded, django_user_model, caller):
    # given a caller that may not write, and a body that is not valid
    client = caller_client(caller, django_user_model)
    before = pool_counts()
    resp = client.post("/api/v1/steps", b'{"steps": [{"uid": ', content_type="application/json")
    # then: the answer is about access (401/403), not the body (400)
    assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content
    assert pool_counts() == before


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("method", "endpoint", "body"), CURATE, ids=[f"{c[0]} {c[1]}" for c in CURATE])
def test_curate_matrix(seeded, django_user_model, caller, method, endpoint, body):
    # given a caller of this kind
    client = caller_client(caller, django_user_model)
    may_curate = caller in ("admin", "operator")
    before = curation_counts()
    # when it writes a dataset or a label
    resp = getattr(client, method)(f"/api/v1/{endpoint}", body, format="json")
    # then only admin keys and operators may; others change nothing
    if may_curate:
        assert resp.status_code in (200, 201), resp.content
        assert curation_counts() != before
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content
        assert curation_counts() == before


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("method", "endpoint", "body"), CONSUME, ids=[f"{c[0]} {c[1]}" for c in CONSUME])
def test_consume_matrix(seeded, django_user_model, caller, method, endpoint, body):
    # given a caller of this kind and a leased batch
    client = caller_client(caller, django_user_model)
    may_consume = caller in (
        ("admin", "operator") if "release" in endpoint else ("consume", "admin", "operator")
    )
    leases = Lease.objects.count()
    status = Lease.objects.get(id=seeded).status
    # when it pulls, acks, nacks or replays
    resp = getattr(client, method)(f"/api/v1/{endpoint.format(lease=seeded)}", body, format="json")
    # then only trainers (and admin keys, operators) may; others lease nothing
    if may_consume:
        assert resp.status_code == 200, resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content
        assert Lease.objects.count() == leases
        assert Lease.objects.get(id=seeded).status == status


@pytest.fixture
def snapshot(seeded, settings, tmp_path) -> str:
    """A done snapshot of the seeded dataset; returns its id."""
    from curation.services.snapshots import snapshot_build, snapshot_create

    settings.MEDIA_ROOT = tmp_path / "media"
    snap = snapshot_create(dataset=D)
    snapshot_build(snapshot_id=snap.id)
    return str(snap.id)


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("method", "endpoint", "body"), SNAPSHOT_CREATE, ids=[c[1] for c in SNAPSHOT_CREATE])
def test_snapshot_create_matrix(seeded, django_user_model, caller, method, endpoint, body):
    client = caller_client(caller, django_user_model)
    before = Snapshot.objects.count()
    resp = getattr(client, method)(f"/api/v1/{endpoint}", body, format="json")
    if caller in ("consume", "admin", "operator"):
        assert resp.status_code == 202, resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content
        assert Snapshot.objects.count() == before


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("endpoint", SNAPSHOT_READS)
def test_snapshot_read_matrix(snapshot, django_user_model, caller, endpoint):
    client = caller_client(caller, django_user_model)
    resp = client.get(f"/api/v1/{endpoint.format(snapshot=snapshot)}")
    if CALLERS[caller][1]:
        assert resp.status_code == 200, resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content


@pytest.fixture
def lineage(seeded) -> str:
    """Checkpoint 1 of run RUN (the seed source's consumer "lin", which acked trajectory
    seed-lin), and run TRAINER_RUN of the consume caller's consumer "seed"; returns the
    seeded lease's id."""
    from curation.services.consume import lease_ack
    from curation.services.lineage import RunIn, run_open
    from pool.services.policy import policy_version_set

    seed = Source.objects.get(name=SEED).id
    steps_ingest(
        steps=[step_in("seed-lin", 0, prompt=[1], response=[3], reward=1.0, is_last=True)], source_id=seed
    )
    dataset_create(name="lin-ds")  # the pull takes both ready trajectories
    actor = Actor(source_id=seed)
    run_open(run=RunIn(consumer="lin", dataset="lin-ds", uid=RUN), actor=actor)
    lease = consumer_pull(consumer="lin", pull=PullIn(dataset="lin-ds"), actor=actor)
    assert lease is not None
    lease_ack(lease_id=lease.id, actor=actor)
    policy_version_set(version=1, run=RUN, sources=frozenset((seed,)))
    owner = Source.objects.get(name="caller-consume").id
    run_open(run=RunIn(consumer="seed", dataset=D, uid=TRAINER_RUN), actor=Actor(source_id=owner))
    return seeded


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("endpoint", LINEAGE_READS)
def test_lineage_read_matrix(lineage, django_user_model, caller, endpoint):
    client = caller_client(caller, django_user_model)
    resp = client.get(f"/api/v1/{endpoint}")
    if CALLERS[caller][1]:
        assert resp.status_code == 200, resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(
    ("method", "endpoint", "body"), LINEAGE_CONSUME, ids=[f"{c[0]} {c[1]}" for c in LINEAGE_CONSUME]
)
def test_lineage_trainer_matrix(lineage, django_user_model, caller, method, endpoint, body):
    from curation.models import Run, StepVerdict

    client = caller_client(caller, django_user_model)
    before = (Run.objects.count(), StepVerdict.objects.count())
    resp = getattr(client, method)(f"/api/v1/{endpoint.format(lease=lineage)}", body, format="json")
    if caller in ("consume", "admin", "operator"):
        assert resp.status_code in (200, 201), resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content
        assert (Run.objects.count(), StepVerdict.objects.count()) == before


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("endpoint", "body"), READ_POSTS, ids=[r[0] for r in READ_POSTS])
def test_read_by_post_matrix(seeded, django_user_model, caller, endpoint, body):
    client = caller_client(caller, django_user_model)
    resp = client.post(f"/api/v1/{endpoint}", body, format="json")
    if CALLERS[caller][1]:
        assert resp.status_code == 200, resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize("endpoint", READS)
def test_read_matrix(seeded, django_user_model, caller, endpoint):
    # given a caller of this kind
    client = caller_client(caller, django_user_model)
    _, may_read = CALLERS[caller]
    # when it reads
    resp = client.get(f"/api/v1/{endpoint}")
    # then any key and the operator may read; others are refused
    if may_read:
        assert resp.status_code == 200, resp.content
    else:
        assert resp.status_code == (401 if caller == "anonymous" else 403), resp.content


def test_the_matrix_covers_every_api_route():
    # given every /api/v1 route and method of the URL map
    from tests.gateway.test_schema import api_routes

    def template(endpoint: str) -> str:
        for value in (S, T, G):
            endpoint = endpoint.replace(value, "{uid}")
        return f"/api/v1/{endpoint.replace(D, '{name}')}"

    def route(endpoint: str) -> str:
        endpoint = endpoint.split("?")[0].replace(RUN, "{uid}").replace(TRAINER_RUN, "{uid}")
        endpoint = endpoint.replace("seed-lin:0", "{uid}").replace("seed-lin", "{uid}")
        endpoint = endpoint.replace("checkpoints/1", "checkpoints/{version}").replace(SEED, "{name}")
        return template(endpoint.replace("{lease}", "{lease_id}").replace("{snapshot}", "{snapshot_id}"))

    covered: dict[str, set[str]] = {}
    for endpoint in LINEAGE_READS:
        covered.setdefault(route(endpoint), set()).add("get")
    for method, endpoint, _ in LINEAGE_CONSUME:
        covered.setdefault(route(endpoint), set()).add(method)
    for endpoint, _ in WRITES:
        covered.setdefault(template(endpoint), set()).add("post")
    for endpoint in READS:
        covered.setdefault(route(endpoint), set()).add("get")
    for method, endpoint, _ in CURATE:
        covered.setdefault(template(endpoint), set()).add(method)
    for method, endpoint, _ in CONSUME:
        path = (
            endpoint.replace("{lease}", "{lease_id}").replace("trainer-x", "{name}").replace("seed", "{name}")
        )
        covered.setdefault(f"/api/v1/{path}", set()).add(method)
    for endpoint, _ in READ_POSTS:
        covered.setdefault(template(endpoint), set()).add("post")
    for method, endpoint, _ in SNAPSHOT_CREATE:
        covered.setdefault(f"/api/v1/{endpoint}", set()).add(method)
    for endpoint in SNAPSHOT_READS:
        covered.setdefault(route(endpoint), set()).add("get")
    covered.setdefault("/api/v1/media", set()).add("post")  # test_media_matrix
    covered.setdefault("/api/v1/media/{sha256}", set()).add("get")
    # then each one is exercised above (a new endpoint must join the matrix)
    assert covered == api_routes()


@pytest.mark.parametrize("path", ["/api/v1/schema/", "/api/v1/docs/", "/healthz"])
def test_schema_docs_and_health_are_public(path):
    # given no credentials
    # when the schema, docs page or health check is fetched
    resp = APIClient().get(path)
    # then it is served
    assert resp.status_code == 200


def test_operator_session_writes_need_the_csrf_token(django_user_model):
    # given an operator signed in through the admin login page with a CSRF-enforcing client
    django_user_model.objects.create_superuser("op", "op@example.com", "pw-op")
    client = APIClient(enforce_csrf_checks=True)
    client.get("/admin/login/")
    token = client.cookies["csrftoken"].value
    resp = client.post(
        "/admin/login/", {"username": "op", "password": "pw-op", "csrfmiddlewaretoken": token, "next": "/"}
    )
    assert resp.status_code == 302
    body = {"steps": [make_step("op-t", 0, prompt=[1, 2], response=[3])]}
    # when it posts steps without, then with, the CSRF token
    without = client.post("/api/v1/steps", body, format="json")
    with_token = client.post(
        "/api/v1/steps", body, format="json", HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value
    )
    # then the first is refused (a cross-site form could not write) and the second stored
    assert without.status_code == 403
    assert with_token.status_code == 201, with_token.content
    assert Step.objects.filter(uid="op-t-s0").exists()


def test_api_keys_are_not_subject_to_csrf(agent_key):
    # given a CSRF-enforcing client holding only a Bearer key (no cookies)
    client = APIClient(enforce_csrf_checks=True)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_key}")
    # when it posts steps
    resp = client.post(
        "/api/v1/steps", {"steps": [make_step("k-t", 0, prompt=[1, 2], response=[3])]}, format="json"
    )
    # then they are stored
    assert resp.status_code == 201, resp.content


def test_multi_scope_key_without_ingest_cannot_write(seeded):
    # given a key with every scope but ingest and admin
    client = client_for(api_key_create(name="cr", scopes=[Scope.CONSUME, Scope.READ])[1])
    # when it writes a reward
    resp = client.post("/api/v1/rewards", {"step_uid": S, "reward": 1.0}, format="json")
    # then 403 and the step still awaits its reward
    assert resp.status_code == 403
    assert Step.objects.get(uid=S).reward_status == Step.RewardStatus.PENDING


def test_writes_are_attributed_to_the_keys_source(seeded, agent_key, agent):
    # given an ingest key named "agent"
    # when it writes a step
    assert (
        agent.post(
            "/api/v1/steps", {"steps": [make_step("src-t", 0, prompt=[1], response=[2])]}, format="json"
        ).status_code
        == 201
    )
    # then the step and its new trajectory belong to that key's source
    step = Step.objects.select_related("source", "trajectory__source").get(uid="src-t-s0")
    assert step.source.name == "agent" and step.trajectory.source.name == "agent"


# --- media (issue 24): uploads are writes, downloads reads -----------------------------------------
def _png(width: int) -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, 2), (1, 2, 3)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize("caller", list(CALLERS))
def test_media_matrix(seeded, django_user_model, settings, tmp_path, caller):
    # given: an image a seeded step references (every caller's key is granted the seed source)
    import base64
    import hashlib

    settings.MEDIA_ROOT = tmp_path / "media"
    data = _png(3)
    step = make_step(
        "seed-img",
        0,
        prompt=[1],
        response=[2],
        multi_modal_data={"images": [base64.b64encode(data).decode()]},
    )
    assert (
        caller_client("admin", django_user_model)
        .post("/api/v1/steps", {"steps": [step]}, format="json")
        .status_code
        == 201
    )
    Step.objects.filter(uid=step["uid"]).update(source_id=Source.objects.get(name=SEED).id)
    client = caller_client(caller, django_user_model)
    may_write, may_read = CALLERS[caller]
    # when: it uploads an image, and downloads the referenced one
    up = client.post("/api/v1/media", data=_png(5), content_type="image/png")
    down = client.get(f"/api/v1/media/{hashlib.sha256(data).hexdigest()}")
    # then: uploads need the ingest scope, downloads any read scope
    if may_write:
        assert up.status_code == 201 and up.json()["width"] == 5, up.content
    else:
        assert up.status_code == (401 if caller == "anonymous" else 403), up.content
    if may_read:
        assert down.status_code == 200 and b"".join(down.streaming_content) == data
    else:
        assert down.status_code == (401 if caller == "anonymous" else 403), down.content
