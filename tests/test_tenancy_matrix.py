"""The tenancy matrix: every REST endpoint that writes or reads a source's data, against
every kind of actor (pool/tenancy.py).

Source A's agent ("own") has a trajectory of two steps in its own prompt group, with
feedback and an event. Another source's ingest key ("other") may neither write nor read
any of it: reads answer 404 as for an unknown uid, writes naming A's uids answer 409
``uid_taken`` (creating) or 404 (targeting), and A's rows stay exactly as they were. A read
key reads everything and writes nothing (403); an admin key does both.

The matrix is checked against the URL conf: every named pattern under /api/v1/ must be
requested by a row here (resolved from the row's path) or carry a reasoned exemption
(test_every_api_endpoint_has_a_row_in_the_matrix), so a new endpoint without a row fails.
"""

from __future__ import annotations

import datetime as dt
from importlib import import_module

import orjson
import pytest
from django.apps import apps as django_apps
from django.conf import settings
from django.db.models import Q, Sum
from django.test import override_settings
from django.urls import URLResolver, get_resolver, resolve
from django.utils import timezone

from curation.models import Dataset, DatasetCount, Snapshot
from curation.selectors.specs import dataset_preview
from curation.services.consume import Actor, PullIn, consumer_pull, lease_ack
from curation.services.counts import _restricted_read, dataset_count_read, dataset_counts_sweep
from curation.services.datasets import dataset_create
from curation.services.lineage import RunIn, run_open
from curation.services.retention import leases_trim
from curation.services.snapshots import snapshot_build, snapshot_create
from curation.specs import spec_parse
from pool.ingest.pipeline import steps_ingest
from pool.models import Event, Feedback, Media, PromptGroup, RewardEvent, Scope, Source, Step, Trajectory
from pool.services.api_keys import api_key_create
from tests.conftest import client_for, make_step, post_steps, rolled_back_world
from tests.media_support import attach, png
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

T, G = "a-t", "a-g"
S0 = f"{T}-s0"
SEED = [
    make_step(T, 0, group=G, prompt=[1, 2, 3], response=[4]),
    make_step(T, 1, group=G, prompt=[1, 2, 3, 4, 5], response=[6]),
]
ACTORS = {"own": [Scope.INGEST], "other": [Scope.INGEST], "read": [Scope.READ], "admin": [Scope.ADMIN]}

# (name, path, body, {actor: status}); an error status names its code.
OK, TAKEN, GONE, DENIED = 200, (409, "uid_taken"), (404, "not_found"), (403, "permission_denied")
WRITES = [
    (
        "step into A's trajectory",
        "steps",
        {"steps": [make_step(T, 2, group=G)]},
        {"own": 201, "admin": 201},
        TAKEN,
    ),
    ("A's step resubmitted", "steps", {"steps": [SEED[0]]}, {"own": OK, "admin": OK}, TAKEN),
    (
        "new trajectory in A's group",
        "steps",
        {"steps": [make_step("b-t", 0, group=G)]},
        {"own": 201, "admin": 201},
        TAKEN,
    ),
    ("trajectory create", "trajectories", {"uid": T}, {"own": OK, "admin": OK}, TAKEN),
    ("trajectory complete", f"trajectories/{T}/complete", {"reward": -5.0}, {"own": OK, "admin": OK}, GONE),
    (
        "completions",
        "trajectory-completions",
        {"completions": [{"uid": T, "reward": -5.0}]},
        {"own": OK, "admin": OK},
        GONE,
    ),
    ("step reward", "rewards", {"step_uid": S0, "reward": -5.0}, {"own": OK, "admin": OK}, GONE),
    ("trajectory reward", "rewards", {"trajectory_uid": T, "reward": -5.0}, {"own": OK, "admin": OK}, GONE),
    ("step feedback", "feedback", {"step_uid": S0, "rating": -1.0}, {"own": 201, "admin": 201}, GONE),
    (
        "trajectory feedback",
        "feedback",
        {"trajectory_uid": T, "rating": -1.0},
        {"own": 201, "admin": 201},
        GONE,
    ),
    ("event on A's step", "events", {"type": "x", "step_uid": S0}, {"own": 201, "admin": 201}, GONE),
    (
        "event on A's trajectory",
        "events",
        {"type": "x", "trajectory_uid": T},
        {"own": 201, "admin": 201},
        GONE,
    ),
    ("group upsert", "groups", {"uid": G, "expected_rollouts": 9}, {"own": OK, "admin": OK}, TAKEN),
]
# (path, what an allowed reader gets: a status or the count of listed results)
READS = [
    (f"steps/{S0}", OK),
    (f"trajectories/{T}", OK),
    (f"groups/{G}", OK),
    (f"groups/{G}/prefix-tree", OK),
    (f"steps?trajectory_uid={T}", 2),
    ("trajectories", 1),
    ("groups", 1),
    ("events", 1),
    ("feedback", 1),
]


@pytest.fixture
def world():
    """A's data (written by A's key) and a client per actor."""
    return world_build()


def world_build() -> dict:
    clients = {
        name: client_for(api_key_create(name=f"tenant-{name}", scopes=scopes)[1])
        for name, scopes in ACTORS.items()
    }
    own = clients["own"]
    assert post_steps(own, SEED).status_code == 201
    assert own.post("/api/v1/feedback", {"step_uid": S0, "label": "seed"}, format="json").status_code == 201
    assert own.post("/api/v1/events", {"type": "seed", "trajectory_uid": T}, format="json").status_code == 201
    return clients


def state_of_a() -> dict:
    """Every stored field of A's rows, and what points at them."""
    return {
        "trajectory": list(Trajectory.objects.filter(uid=T).values()),
        "steps": list(Step.objects.filter(trajectory__uid=T).order_by("step_index").values()),
        "group": list(PromptGroup.objects.filter(uid=G).values()),
        "trajectories_in_group": list(Trajectory.objects.filter(group__uid=G).values_list("uid", flat=True)),
        "reward_events": list(RewardEvent.objects.values()),
        "feedback": list(Feedback.objects.values()),
        "events": list(Event.objects.values()),
    }


def expected_status(expect: dict, denied: tuple, actor: str) -> tuple[int, str | None]:
    if actor == "read":
        return DENIED
    if actor in expect:
        return expect[actor], None
    return denied


@pytest.mark.parametrize("actor", list(ACTORS))
@pytest.mark.parametrize(("name", "path", "body", "expect", "denied"), WRITES, ids=[w[0] for w in WRITES])
def test_write_matrix(world, actor, name, path, body, expect, denied):
    # given A's data
    before = state_of_a()
    # when an actor writes to it
    resp = world[actor].post(f"/api/v1/{path}", body, format="json")
    # then only A and admins may; a refused write changes nothing of A's, field by field
    status, code = expected_status(expect, denied, actor)
    assert resp.status_code == status, resp.content
    if code is not None:
        assert resp.json()["error"]["code"] == code
        assert state_of_a() == before
    if code == "uid_taken":  # says nothing more than that the uid is taken
        assert "is taken" in resp.json()["error"]["message"]
        assert "step_index" not in resp.json()["error"]["message"]


@pytest.mark.parametrize("actor", list(ACTORS))
@pytest.mark.parametrize(("path", "allowed"), READS, ids=[r[0] for r in READS])
def test_read_matrix(world, actor, path, allowed):
    # when an actor reads A's data
    resp = world[actor].get(f"/api/v1/{path}")
    # then A, read keys and admins see it; another source sees an unknown uid or nothing
    sees = actor != "other"
    if allowed == OK:
        assert resp.status_code == (OK if sees else 404), resp.content
        if not sees:  # exactly as for a uid that does not exist
            unknown = world["own"].get(
                f"/api/v1/{path.replace(T, 'nope').replace(G, 'nope').replace(S0, 'nope')}"
            )
            assert resp.status_code == unknown.status_code
            assert resp.json()["error"]["code"] == unknown.json()["error"]["code"]
    else:
        assert resp.status_code == OK, resp.content
        assert len(resp.json()["results"]) == (allowed if sees else 0)


def test_a_key_granted_another_source_writes_and_reads_it_as_its_own(world):
    # given a key of source B granted source A (an admin's choice)
    _, clear = api_key_create(
        name="b-granted", source_name="tenant-other", scopes=[Scope.INGEST], extra_sources=["tenant-own"]
    )
    granted = client_for(clear)
    # when it rewards A's step and reads it
    assert granted.post("/api/v1/rewards", {"step_uid": S0, "reward": 0.5}, format="json").status_code == 200
    # then it did, like A
    assert granted.get(f"/api/v1/steps/{S0}").json()["reward"] == 0.5


def test_a_shared_group_takes_every_sources_trajectories(world):
    # given a group an admin created (shared: no source)
    assert world["admin"].post("/api/v1/groups", {"uid": "shared-g"}, format="json").status_code == 200
    # when A and B write rollouts into it
    for actor in ("own", "other"):
        assert post_steps(world[actor], [make_step(f"{actor}-r", 0, group="shared-g")]).status_code == 201
    # then both are its rollouts; neither may change the group itself
    assert sorted(Trajectory.objects.filter(group__uid="shared-g").values_list("uid", flat=True)) == [
        "other-r",
        "own-r",
    ]
    for actor in ("own", "other"):
        r = world[actor].post("/api/v1/groups", {"uid": "shared-g", "expected_rollouts": 1}, format="json")
        assert (r.status_code, r.json()["error"]["code"]) == (409, "uid_taken")
    assert PromptGroup.objects.get(uid="shared-g").expected_rollouts is None


# --- every /api/v1 endpoint, from the URL conf ---------------------------------------------------
# The rows below cover the endpoints the tables above do not: snapshots, datasets and their
# previews, stats, consumers and leases, tasks and the sampler, media, policy versions, labels.
# Their world (``pool``) is A's data above plus B's own rows, an image on A's step, a dataset
# naming A alone ("a-only") and one naming no source ("everyone"), a snapshot of each, a
# consumer of A's source with a lease, and a task and a sampler record per source. Two more
# actors: a trainer (consume key) of each source.
#
# Expectations, per actor: SEES (200), HIDDEN (404 with exactly the body of an unknown id), a
# status (403: the scope is missing), or the numbers a count answers (computed from the
# database for the sources the actor may read, compared field by field).
SEES, HIDDEN = "sees", "hidden"
A_NAME, B_NAME = "tenant-own", "tenant-other"
POOL_ACTORS = ("own", "other", "read", "admin", "own-trainer", "other-trainer")
UNKNOWN_UUID = "00000000-0000-0000-0000-000000000000"
# Actor -> the sources whose rows it reads (None: every source's): its read sources
# (pool/tenancy.py), and, for what datasets serve (previews, the catalogue, snapshots),
# every source's for a consume key: consumption is not filtered by source.
READS_OF = {
    "own": {A_NAME},
    "other": {B_NAME},
    "read": None,
    "admin": None,
    "own-trainer": {A_NAME},
    "other-trainer": {B_NAME},
}
SERVED_OF = {**READS_OF, "own-trainer": None, "other-trainer": None}


def everyone(value, **but):
    return {actor: but.get(actor.replace("-", "_"), value) for actor in POOL_ACTORS}


# Consumption: consume keys and admins; another source's consumer or lease is unknown.
CONSUMING = everyone(403, admin=SEES, own_trainer=SEES, other_trainer=HIDDEN)
# Runs: their source's readers, read and admin keys; another source's run is unknown.
RUNS = everyone(SEES, other=HIDDEN, other_trainer=HIDDEN)
OPENS = everyone(403, admin=201, own_trainer=201, other_trainer=201)
# (case, method, path, body, {actor: expectation}, unknown path for HIDDEN or a counter)
DETAILS = [
    ("snapshot of A's rows", "get", "snapshots/{sa}", None, everyone(SEES, other=HIDDEN)),
    ("its download", "get", "snapshots/{sa}/download", None, everyone(SEES, other=HIDDEN)),
    (
        "snapshot of A's and B's rows",
        "get",
        "snapshots/{sab}",
        None,
        everyone(SEES, own=HIDDEN, other=HIDDEN),
    ),
    ("its download too", "get", "snapshots/{sab}/download", None, everyone(SEES, own=HIDDEN, other=HIDDEN)),
    (
        "snapshot create",
        "post",
        "snapshots",
        {"dataset": "a-only"},
        everyone(403, admin=202, own_trainer=202, other_trainer=202),
    ),
    ("dataset naming A", "get", "datasets/a-only", None, everyone(SEES, other=HIDDEN)),
    ("its preview", "get", "datasets/a-only/preview", None, everyone(SEES, other=HIDDEN)),
    ("dataset naming no source", "get", "datasets/everyone", None, everyone(SEES)),
    ("its versions' diff", "get", "datasets/a-only/diff?from=1&to=1", None, everyone(SEES, other=HIDDEN)),
    ("two snapshots' diff", "get", "snapshots/{sa}/diff?to={sa}", None, everyone(SEES, other=HIDDEN)),
    ("dataset create", "post", "datasets", {"name": "new-ds"}, everyone(403, admin=201)),
    ("A's image", "get", "media/{sha}", None, everyone(SEES, other=HIDDEN)),
    ("A's consumer", "get", "consumers/a-cons", None, CONSUMING),
    ("A's lease batch", "get", "leases/{lease}/batch", None, CONSUMING),
    (
        "A's lease batch past its replay window",
        "get",
        "leases/{trimmed}/batch",
        None,
        everyone(403, admin=(410, "gone"), own_trainer=(410, "gone"), other_trainer=HIDDEN),
    ),
    ("A's lease ack", "post", "leases/{lease}/ack", None, CONSUMING),
    ("A's lease nack", "post", "leases/{lease}/nack", None, CONSUMING),
    (
        "A's lease verdicts",
        "post",
        "leases/{lease}/verdicts",
        {"steps": [{"uid": "a-ready:0", "logprob_kl": 0.1}]},
        CONSUMING,
    ),
    ("lease release", "post", "leases/{lease}/release", None, everyone(403, admin=SEES)),
    (
        "pull as A's consumer",
        "post",
        "consumers/a-cons/pull",
        {"dataset": "everyone"},
        # consumer names are per source: B's trainer pulls as its own "a-cons", a consumer of
        # B's source (tests/curation/test_consumer_names.py: A's stays as it was)
        {**CONSUMING, "other-trainer": SEES},
    ),
    ("labels", "post", "labels", {"step_uids": [S0], "label": "accepted"}, everyone(403, admin=SEES)),
    ("policy version set", "post", "policy-versions", {"version": 3}, everyone(403, admin=SEES)),
    # Lineage: a run is its consumer's source's (A's "a-run": consumer a-cons2, checkpoint 2);
    # the steps behind it are the reader's served sources'.
    ("run open", "post", "runs", {"consumer": "a-cons", "dataset": "everyone"}, OPENS),
    ("A's run", "get", "runs/a-run", None, RUNS),
    ("its checkpoints", "get", "runs/a-run/checkpoints", None, RUNS),
    ("its checkpoint", "get", "runs/a-run/checkpoints/2", None, RUNS),
    ("its steps", "get", "runs/a-run/checkpoints/2/steps", None, RUNS),
    ("its step uids", "get", "runs/a-run/checkpoints/2/steps/download", None, RUNS),
    ("its trajectories", "get", "runs/a-run/checkpoints/2/trajectories", None, RUNS),
    ("its difference", "get", "runs/a-run/checkpoints/2/diff?to=2", None, RUNS),
    ("its replay", "get", "runs/a-run/replay", None, CONSUMING),
    ("A's step's checkpoints", "get", f"steps/{S0}/checkpoints", None, everyone(SEES, other=HIDDEN)),
    (
        "A's trajectory's checkpoints",
        "get",
        f"trajectories/{T}/checkpoints",
        None,
        everyone(SEES, other=HIDDEN),
    ),
    ("A's source's checkpoints", "get", f"sources/{A_NAME}/checkpoints", None, everyone(SEES, other=HIDDEN)),
    (
        "run checkpoint",
        "post",
        "policy-versions",
        {"version": 3, "run": "a-run"},
        everyone(403, admin=SEES),
    ),
]


def stats_expected(sources):
    """GET /stats's counts for a reader of ``sources`` (names; None: all), from the rows."""
    ids = (
        None if sources is None else set(Source.objects.filter(name__in=sources).values_list("id", flat=True))
    )

    def mine(qs, *fields):
        if ids is None:
            return qs
        cond = Q()
        for f in fields:
            cond |= Q(**{f"{f}__in": ids})
        return qs.filter(cond)

    steps = mine(Step.objects.all(), "trajectory__source_id")
    return {
        "steps": steps.count(),
        "trajectories": mine(Trajectory.objects.all(), "source_id").count(),
        # groups: its sources' and the shared ones (no source), as GET /groups lists them
        "groups": mine(PromptGroup.objects.all(), "source_id").count()
        + (PromptGroup.objects.filter(source__isnull=True).count() if ids is not None else 0),
        "events": mine(Event.objects.all(), "source_id", "trajectory__source_id").count(),
        "feedback": mine(
            Feedback.objects.all(), "source_id", "trajectory__source_id", "step__trajectory__source_id"
        ).count(),
        "step_tokens": steps.aggregate(n=Sum("seq_len"))["n"] or 0,
    }


def preview_expected(sources):
    """POST /datasets/preview {sources: [A], readiness: any}: every step of A's the reader may read."""
    if sources is not None and A_NAME not in sources:
        return {"steps": 0, "trajectories": 0, "prompt_tokens": 0, "response_tokens": 0}
    steps = Step.objects.filter(trajectory__source__name=A_NAME)
    agg = steps.aggregate(pt=Sum("prompt_len"), st=Sum("seq_len"))
    return {
        "steps": steps.count(),
        "trajectories": steps.values("trajectory_id").distinct().count(),
        "prompt_tokens": agg["pt"],
        "response_tokens": agg["st"] - agg["pt"],
    }


KEPT_SPEC: dict = {}  # the default spec: ready steps, groups whole


def kept_expected(sources):
    """GET /datasets/kept/preview (ready steps in whole groups: a dataset that keeps its count,
    curation/services/counts.py): what the reader's sources' rows admit, counted live."""
    return dataset_preview(spec_parse(KEPT_SPEC), source_ids(sources))


def source_ids(names):
    return (
        None
        if names is None
        else frozenset(Source.objects.filter(name__in=names).values_list("id", flat=True))
    )


def of_sources(names, sources):
    """The names (tasks' uids or sources) among ``names`` (name -> source) a reader of ``sources`` sees."""
    return sorted(n for n, src in names.items() if sources is None or src in sources)


TASKS = {"a-task": A_NAME, "b-task": B_NAME}
# (case, method, path, body, what the answer's numbers are, what they must be for a reader)
COUNTS = [
    (
        "stats",
        "get",
        "stats",
        None,
        lambda r: {
            **{k: r[k] for k in ("steps", "trajectories", "groups", "events", "feedback")},
            "step_tokens": r["tokens"]["step_tokens"],
        },
        lambda actor: stats_expected(READS_OF[actor]),
    ),
    (
        "preview naming A",
        "post",
        "datasets/preview",
        {"filters": {"sources": [A_NAME], "readiness": "any"}},
        lambda r: {k: r[k] for k in ("steps", "trajectories", "prompt_tokens", "response_tokens")},
        lambda actor: preview_expected(SERVED_OF[actor]),
    ),
    (
        "kept preview of a dataset naming no source",
        "get",
        "datasets/kept/preview",
        None,
        lambda r: {k: v for k, v in r.items() if k not in ("dataset", "version")},
        lambda actor: kept_expected(SERVED_OF[actor]),
    ),
    (
        "dataset catalogue",
        "get",
        "datasets",
        None,
        lambda r: sorted(d["name"] for d in r),
        lambda actor: ["everyone", "kept"] if actor == "other" else ["a-only", "everyone", "kept"],
    ),
    (
        "tasks",
        "get",
        "tasks",
        None,
        lambda r: sorted(t["uid"] for t in r["results"]),
        lambda actor: of_sources(TASKS, READS_OF[actor]),
    ),
    (
        "task sampler",
        "post",
        "task-sampler",
        {"n": 10, "strategy": "uniform"},
        lambda r: sorted(t["uid"] for t in r["tasks"]),
        lambda actor: of_sources(TASKS, READS_OF[actor]),
    ),
    (
        "sampler records",
        "get",
        "task-sampler/records",
        None,
        lambda r: sorted(rec["source"] for rec in r["results"]),
        lambda actor: sorted(
            Source.objects.filter(
                name__in=of_sources({A_NAME: A_NAME, B_NAME: B_NAME}, READS_OF[actor])
            ).values_list("id", flat=True)
        ),
    ),
    (
        "runs",
        "get",
        "runs",
        None,
        lambda r: [run["uid"] for run in r["results"]],
        lambda actor: [] if actor in ("other", "other-trainer") else ["a-run"],
    ),
    (
        "policy versions: the pool's, not a source's",
        "get",
        "policy-versions",
        None,
        lambda r: [(p["version"], p["is_current"]) for p in r],
        lambda actor: [(2, True), (1, False)],
    ),
]
# Endpoints without a row here, and why: none holds a source's rows.
EXEMPT = {
    "api:schema": "the OpenAPI schema: describes the endpoints, holds no data",
    "api:docs": "Swagger UI over the schema",
    "api:media": "an upload stores bytes by content and answers their sha256; who may read an "
    "image is media-detail's row",
}


@pytest.fixture(scope="module")
def pool_built(django_db_setup, django_db_blocker, tmp_path_factory):
    """The pool below, built once for the module (its rows, an image and two snapshots'
    files) and rolled back after its last test."""
    with override_settings(MEDIA_ROOT=tmp_path_factory.mktemp("media")):
        with rolled_back_world(django_db_blocker, lambda: pool_build(world_build())) as built:
            yield built


@pytest.fixture
def pool(pool_built, db):
    """(clients, ids) of the pool; what a test writes is rolled back after it (its ``db``
    transaction is a savepoint in the module's: ``rolled_back_world``)."""
    return pool_built


def pool_build(world: dict) -> tuple[dict, dict]:
    """A's data (``world``) and everything the rows above read; returns (clients, ids)."""
    clients = dict(world)
    for actor, source in (("own-trainer", A_NAME), ("other-trainer", B_NAME)):
        clients[actor] = client_for(api_key_create(name=actor, source_name=source, scopes=[Scope.CONSUME])[1])
    a, b = (Source.objects.get(name=n).id for n in (A_NAME, B_NAME))
    assert (
        post_steps(
            world["other"], [make_step("b-t", 0, group="b-g", prompt=[7, 8], response=[9])]
        ).status_code
        == 201
    )
    attach(S0, [png(1)])
    # a ready rollout of A's (the consumer's lease serves it)
    steps_ingest(
        steps=[step_in("a-ready", 0, prompt=[1], response=[2], reward=1.0, is_last=True)], source_id=a
    )
    dataset_create(name="a-only", spec={"filters": {"sources": [A_NAME], "readiness": "any"}})
    dataset_create(name="everyone", spec={"filters": {"readiness": "any"}})
    dataset_create(name="kept", spec=KEPT_SPEC)
    dataset_counts_sweep()  # the count beat's (on commit, a new version's count is built)
    snaps = {}
    for key, name in (("sa", "a-only"), ("sab", "everyone")):
        snaps[key] = str(snapshot_create(dataset=name).id)
        snapshot_build(snapshot_id=snaps[key])
    lease = consumer_pull(consumer="a-cons", pull=PullIn(dataset="everyone"), actor=Actor(source_id=a))
    assert lease is not None
    # A's training run: its consumer acks a lease, checkpoint 2 (below) takes it
    run_open(run=RunIn(uid="a-run", consumer="a-cons2", dataset="everyone"), actor=Actor(source_id=a))
    trained = consumer_pull(consumer="a-cons2", pull=PullIn(dataset="everyone"), actor=Actor(source_id=a))
    assert trained is not None
    lease_ack(lease_id=trained.id)
    # an acked lease of A's past its replay window: its batch is trimmed (the replay is 410)
    old = consumer_pull(consumer="a-cons3", pull=PullIn(dataset="everyone"), actor=Actor(source_id=a))
    assert old is not None
    lease_ack(lease_id=old.id)
    later = timezone.now() + dt.timedelta(days=settings.CLAW_RETENTION_REPLAY_DAYS + 1)
    assert leases_trim(now=later) == 1
    for actor, uid in (("own", "a-task"), ("other", "b-task")):
        assert (
            world[actor]
            .post("/api/v1/tasks", {"tasks": [{"uid": uid, "set": "s"}]}, format="json")
            .status_code
            == 201
        )
        assert (
            world[actor]
            .post("/api/v1/task-sampler", {"n": 1, "strategy": "uniform"}, format="json")
            .status_code
            == 200
        )
    for version in (1, 2):
        run = {"run": "a-run"} if version == 2 else {}
        assert (
            world["admin"]
            .post("/api/v1/policy-versions", {"version": version, **run}, format="json")
            .status_code
            == 200
        )
    ids = {
        **snaps,
        "sha": Media.objects.get().sha256,
        "lease": str(lease.id),
        "trimmed": str(old.id),
        "a": a,
        "b": b,
    }
    return clients, ids


def unknown_of(path: str, ids: dict) -> tuple[str, str, str]:
    """``path`` with its id swapped for one that does not exist: (path, real id, unknown id)."""
    for key in ("sa", "sab", "lease", "trimmed"):
        if "{" + key + "}" in path:
            return path.replace("{" + key + "}", UNKNOWN_UUID), ids[key], UNKNOWN_UUID
    if "{sha}" in path:
        return path.replace("{sha}", "0" * 64), ids["sha"], "0" * 64
    for name in (S0, T, A_NAME):
        if f"/{name}/" in path:
            return path.replace(name, "nope"), name, "nope"
    for name in ("a-only", "a-cons", "a-run"):
        if name in path:
            return path.replace(name, "no-such"), name, "no-such"
    raise AssertionError(f"no id to swap in {path}")


def call(client, method: str, path: str, body):
    return (
        getattr(client, method)(f"/api/v1/{path}", body, format="json")
        if body is not None or method == "post"
        else client.get(f"/api/v1/{path}")
    )


@pytest.mark.parametrize("actor", POOL_ACTORS)
@pytest.mark.parametrize(("name", "method", "path", "body", "expect"), DETAILS, ids=[d[0] for d in DETAILS])
def test_detail_matrix(pool, actor, name, method, path, body, expect):
    clients, ids = pool
    real = path.format(**ids)
    # when an actor asks for it
    resp = call(clients[actor], method, real, body)
    # then it sees it, or it is unknown to it exactly as an id that does not exist, or 403
    want = expect[actor]
    if want == SEES:
        assert resp.status_code == 200, resp.content
    elif want == HIDDEN:
        unknown, real_id, unknown_id = unknown_of(path, ids)
        none = call(clients[actor], method, unknown.format(**ids), body)
        assert resp.status_code == none.status_code == 404, (resp.content, none.content)
        assert resp.json() == orjson.loads(none.content.decode().replace(unknown_id, real_id))
    elif isinstance(want, tuple):
        assert (resp.status_code, resp.json()["error"]["code"]) == want, resp.content
    else:
        assert resp.status_code == want, resp.content


@pytest.mark.parametrize("actor", POOL_ACTORS)
@pytest.mark.parametrize(
    ("name", "method", "path", "body", "pick", "expected"), COUNTS, ids=[c[0] for c in COUNTS]
)
def test_count_matrix(pool, actor, name, method, path, body, pick, expected):
    clients, _ = pool
    # when an actor asks for a count
    resp = call(clients[actor], method, path, body)
    # then its numbers cover the rows it may read, field by field
    assert resp.status_code == 200, resp.content
    assert pick(resp.json()) == expected(actor)


def test_the_counts_differ_by_reader(pool):
    # given the pool: A's and B's rows
    # then the expectations above are not all equal (a count that ignored the reader would fail)
    assert stats_expected(READS_OF["own"]) != stats_expected(READS_OF["other"]) != stats_expected(None)
    assert preview_expected(READS_OF["own"])["steps"] > 0 == preview_expected(READS_OF["other"])["steps"]
    assert kept_expected(READS_OF["own"]) != kept_expected(READS_OF["other"]) != kept_expected(None)
    assert kept_expected(READS_OF["own"])["steps"] > 0


def test_the_kept_preview_of_every_reader_is_read_from_its_kept_count(pool):
    # given the pool, the kept dataset's count built before the later writes (folded since)
    clients, _ = pool
    version = Dataset.objects.get(name="kept").current
    assert clients["admin"].get("/api/v1/datasets/kept/preview").status_code == 200
    assert DatasetCount.objects.get(version=version).built
    # then every reader's preview comes from the count, the per-source totals included,
    # not from the live count that the matrix compares it with
    for actor in POOL_ACTORS:
        sources = source_ids(SERVED_OF[actor])
        kept = dataset_count_read(version) if sources is None else _restricted_read(version, sources)
        assert kept == kept_expected(SERVED_OF[actor]), actor


def api_url_names() -> set[str]:
    """Every named URL pattern under /api/v1/, walked from the root URL conf."""
    names: set[str] = set()

    def walk(patterns, prefix: str, namespace: str) -> None:
        for p in patterns:
            route = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, route, f"{namespace}{p.namespace}:" if p.namespace else namespace)
            elif route.lstrip("^").startswith("api/v1/"):
                assert p.name, f"an unnamed /api/v1 pattern: {route}"
                names.add(namespace + p.name)

    walk(get_resolver().url_patterns, "", "")
    return names


def matrix_rows() -> dict[str, list[str]]:
    """url name -> the cases of this module that request it (resolved from their paths)."""
    rows: dict[str, list[str]] = {}
    paths = [(w[0], w[1]) for w in WRITES] + [(r[0], r[0]) for r in READS]
    paths += [(d[0], d[2]) for d in DETAILS] + [(c[0], c[2]) for c in COUNTS]
    fake = {
        "sa": UNKNOWN_UUID,
        "sab": UNKNOWN_UUID,
        "lease": UNKNOWN_UUID,
        "trimmed": UNKNOWN_UUID,
        "sha": "0" * 64,
    }
    for case, path in paths:
        name = resolve("/api/v1/" + path.format(**fake).split("?")[0]).view_name
        rows.setdefault(name, []).append(case)
    return rows


def test_every_api_endpoint_has_a_row_in_the_matrix():
    # given every named pattern under /api/v1/ in the URL conf
    names = api_url_names()
    rows = matrix_rows()
    # then each one has a row (a case that requests it) or a reasoned exemption, never both;
    # a new endpoint without one fails here
    assert names - set(rows) - set(EXEMPT) == set(), "endpoints without a row in the tenancy matrix"
    assert set(rows) & set(EXEMPT) == set()
    assert set(EXEMPT) <= names and set(rows) <= names
    assert len(names) >= 35


def test_a_snapshot_records_its_rows_sources_and_the_migration_backfills_them(pool):
    # given the snapshots of A's rows and of A's and B's
    _, ids = pool
    recorded = {key: Snapshot.objects.get(id=ids[key]).source_ids for key in ("sa", "sab")}
    # then each names the sources of its rows, ascending
    assert recorded == {"sa": [ids["a"]], "sab": [ids["a"], ids["b"]]}
    # when they are forgotten, as before curation migration 0008, and it runs
    Snapshot.objects.update(source_ids=None)
    import_module("curation.migrations.0008_snapshot_sources").backfill(django_apps, None)
    # then it records the same
    assert {key: Snapshot.objects.get(id=ids[key]).source_ids for key in ("sa", "sab")} == recorded
