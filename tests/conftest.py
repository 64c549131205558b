"""Shared fixtures: personas (API keys per scope, an operator) and step payload builders."""

from __future__ import annotations

import functools
import os
import random
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx._transports.default as httpx_transports
import pytest
from _pytest.nodeid import coerce_node_id
from django.db import transaction
from rest_framework.test import APIClient

from pool.models import Scope
from pool.services.api_keys import api_key_create
from tests import durations

# CI runs the suite twice, on SQLite and on PostgreSQL + Redis (.ci/run). Its second pass sets
# CLAW_TEST_ONCE_RAN=1 and skips the tests marked backend_independent: those whose outcome
# cannot depend on DATABASE_URL or REDIS_URL (a package installing alone, a signal ending
# serve, a benchmark of pure computation), which the first pass ran. A plain `make test`, on
# either backend, runs them.
ONCE_RAN = os.environ.get("CLAW_TEST_ONCE_RAN") == "1"
T = TypeVar("T")


def _one_ssl_context_per_setting(make):
    """httpx builds a new SSL context for every client (certifi's CA bundle loaded: ~25 ms of
    CPU), even for plain http:// URLs, and ``httpx.get``/``post`` build a client per call. The
    suite calls its live servers that way hundreds of times (each server's start polls
    /healthz): ~47 s of a pass's CPU went there (py-spy). The test process keeps one context
    per setting, as a long-lived client would; unhashable settings build their own. Speed
    only: were httpx to move the function or change its arguments, its clients would build
    their own contexts again (the arguments pass through as they come)."""
    cached = functools.lru_cache(maxsize=8)(make)

    @functools.wraps(make)
    def context(*args, **kwargs):
        try:
            return cached(*args, **kwargs)
        except TypeError:  # an unhashable setting (an SSLContext of the caller's, say)
            return make(*args, **kwargs)

    return context


httpx_transports.create_ssl_context = _one_ssl_context_per_setting(httpx_transports.create_ssl_context)


@contextmanager
def rolled_back_world(django_db_blocker, build: Callable[[], T]) -> Iterator[T]:
    """Rows built once for a module's tests (``build()``, whose result it yields), as
    Django's ``TestCase.setUpTestData``: in a transaction around the module, in which each
    test's ``db`` transaction nests as a savepoint, so what a test writes is rolled back to
    the shared rows after it, and the shared rows are rolled back after the module. Tests
    that need rows committed (``transaction=True``, live servers) cannot use it."""
    with django_db_blocker.unblock():
        outer = transaction.atomic()
        outer.__enter__()
        try:
            built = build()
        except BaseException:
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)
            raise
    try:
        yield built
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            outer.__exit__(None, None, None)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """pytest-django's test database (set up only when a test needs it), and at the end of the
    session, before it is dropped (this wrapper's teardown runs first): on PostgreSQL, the
    sessions this process's long-lived threads still hold on it are ended. The gateway's
    database threads and its writer (gateway/proxy/db.py) keep their connections for the
    life of the process, and the live flusher's read returns its connection to the pool;
    DROP DATABASE refused while they were open ("being accessed by other users") and left
    the database behind."""
    yield
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cur:
        cur.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(autouse=True)
def _no_hints_from_earlier_tests():
    """The proxy's per-process hints (pool/ingest/claim.py) name rows by id, and an earlier
    test's rows are rolled back (SQLite then hands their ids out again): every test starts
    without them, as a new process would."""
    from pool.ingest.claim import anchors, recent

    recent.clear()
    anchors.clear()


@pytest.fixture
def make_key(db):
    def _make(*scopes: str, name: str | None = None) -> str:
        _, clear = api_key_create(
            name=name or f"key-{'-'.join(scopes)}-{random.random()}", scopes=list(scopes)
        )
        return clear

    return _make


@pytest.fixture
def agent_key(make_key) -> str:
    return make_key(Scope.INGEST, name="agent")


@pytest.fixture
def trainer_key(make_key) -> str:
    """A trainer's key: it pulls (consume) and publishes policy versions (policy)."""
    return make_key(Scope.CONSUME, Scope.POLICY, name="trainer")


@pytest.fixture
def reader_key(make_key) -> str:
    return make_key(Scope.READ, name="reader")


@pytest.fixture
def admin_key(make_key) -> str:
    return make_key(Scope.ADMIN, name="admin")


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_superuser("operator", "op@example.com", "pw-operator")


def client_for(key: str | None) -> APIClient:
    c = APIClient()
    if key:
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return c


@pytest.fixture
def agent(agent_key) -> APIClient:
    return client_for(agent_key)


@pytest.fixture
def reader(reader_key) -> APIClient:
    return client_for(reader_key)


def make_step(
    traj: str = "t1",
    index: int = 0,
    *,
    group: str | None = "g1",
    prompt: list[int] | None = None,
    response: list[int] | None = None,
    rng: random.Random | None = None,
    **extra,
) -> dict:
    rng = rng or random.Random(hash((traj, index)) & 0xFFFF)
    step = {
        "uid": f"{traj}-s{index}",
        "trajectory_uid": traj,
        "prompt_group_uid": group,
        "step_index": index,
        "prompt_ids": prompt if prompt is not None else [rng.randrange(150_000) for _ in range(32)],
        "response_ids": response if response is not None else [rng.randrange(150_000) for _ in range(8)],
    }
    step.update(extra)
    return step


def post_steps(client: APIClient, steps: list[dict]):
    return client.post("/api/v1/steps", {"steps": steps}, format="json")


@pytest.fixture
def live(tmp_path):
    """A running server process with its own database (see tests/live.py)."""
    from tests.live import live_server

    with live_server(tmp_path) as server:
        yield server


def pytest_collection_modifyitems(items) -> None:
    """Give each schemathesis operation its own node id. Under pytest 9's structured node ids
    every item schemathesis 4 makes has the test function's id alone (its name carries the
    operation, its id drops it), and pytest-xdist's file scheduling keys items by node id:
    `make test` ran one operation of 43. The operation's label ("GET /api/v1/steps") makes the
    id unique, and says which operation failed."""
    for item in items:
        label = getattr(item, "operation_label", None)
        if label and not item.nodeid.endswith(f"[{label}]"):
            item._id = coerce_node_id(f"{item.nodeid}[{label}]")
    if ONCE_RAN:
        skip = pytest.mark.skip(
            reason="backend_independent: this run's SQLite pass ran it (CLAW_TEST_ONCE_RAN)"
        )
        for item in items:
            if item.get_closest_marker("backend_independent"):
                item.add_marker(skip)
    # Whole files, the longest first (tests/durations.py): with `--no-loadscope-reorder`
    # (Makefile) xdist hands them out in this order, so no long file starts last.
    durations.order(items, durations.load())


def pytest_configure(config) -> None:
    """The run's controller (xdist's, or the one process of `-n 0`) names a folder for the
    live servers' shared templates (tests/live.py): its workers and every process they start
    inherit it, so the run migrates one template per backend instead of one per process."""
    from tests.live import SHARED_ENV, drop_shared

    if hasattr(config, "workerinput") or os.environ.get(SHARED_ENV):
        return
    folder = tempfile.mkdtemp(prefix="claw-test-templates-")
    os.environ[SHARED_ENV] = folder
    config.add_cleanup(lambda: drop_shared(Path(folder)))
