"""Operations: /readyz, /metrics, request logs (JSON lines), security headers, and what
`serve` says and starts in production."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import signal
import subprocess

import pytest
from django.core.management import call_command
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from claw_kit import metrics
from claw_kit.jsonlog import JsonFormatter
from claw_site.management.commands import serve
from claw_site.requestlog import RequestLogMiddleware
from curation.models import Lease
from pool.ingest.pipeline import steps_ingest
from pool.models import Step
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

CLOSED_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


# --- /readyz ---------------------------------------------------------------------------------
def test_readyz_is_ok_with_every_configured_dependency(settings):
    # when the readiness probe runs against this test's database (and Redis if configured)
    resp = Client().get("/readyz")
    # then it is 200 and names each dependency
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"database": "ok", "redis": "ok" if settings.REDIS_URL else "not configured"}


def test_readyz_is_503_naming_redis_when_redis_does_not_answer(settings):
    # given a Redis URL nothing listens on
    settings.REDIS_URL = CLOSED_REDIS
    # when the probe runs
    resp = Client().get("/readyz")
    # then 503, Retry-After, and the failure named; the database is still fine
    assert resp.status_code == 503
    assert int(resp["Retry-After"]) > 0
    body = resp.json()
    assert body["failed"] == ["redis"] and body["database"] == "ok"
    assert body["redis"].startswith("error: ")


def test_readyz_refuses_writes():
    assert Client().post("/readyz").status_code == 405


# --- /metrics --------------------------------------------------------------------------------
def scrape(resp) -> dict[str, list]:
    assert resp.status_code == 200, resp.content
    assert resp["Content-Type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(resp.content.decode())}


@pytest.mark.parametrize(
    ("header", "status"),
    [(None, 401), ("Bearer wrong", 401), ("Basic abc", 401), ("ingest", 403), ("read", 403)],
)
def test_metrics_needs_an_admin_key_or_the_scrape_token(make_key, settings, header, status):
    settings.CLAW_METRICS_TOKEN = "scrape-secret"
    if header in ("ingest", "read"):
        header = f"Bearer {make_key(header)}"
    resp = Client().get("/metrics", **({"HTTP_AUTHORIZATION": header} if header else {}))
    assert resp.status_code == status
    assert resp.json()["error"]["type"] == ("authentication_error" if status == 401 else "permission_error")


def test_metrics_with_the_scrape_token_reads_the_pool(settings, make_key):
    # given a pool with steps from two sources, one with drift
    settings.CLAW_METRICS_TOKEN = "scrape-secret"
    steps_ingest(steps=[step_in("m-t1", 0, prompt=[1, 2], response=[3])])
    steps_ingest(
        steps=[
            step_in("m-t2", 0, prompt=[1, 2], response=[3]),
            step_in("m-t2", 1, prompt=[1, 2, 3, 9], response=[4]),
        ]
    )
    Step.objects.filter(uid="m-t2:1").update(drift=True)
    # when Prometheus scrapes with the token
    families = scrape(Client().get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret"))
    # then the counts are the database's, by source and token source, and by status
    steps = {(s.labels["source"], s.labels["token_source"]): s.value for s in families["claw_steps"]}
    assert sum(steps.values()) == Step.objects.count() == 3
    assert families["claw_steps_drift"][0].value == 1
    assert families["claw_drift_rate"][0].value == pytest.approx(1 / 3)
    trajectories = {s.labels["status"]: s.value for s in families["claw_trajectories"]}
    assert sum(trajectories.values()) == 2
    assert "claw_leases" in families and not Lease.objects.exists()
    for name in ("claw_snapshot_build_seconds", "claw_merge_build_seconds"):
        assert {s.name for s in families[name]} == {f"{name}_count", f"{name}_sum"}
    assert "claw_celery_queue_length" in families
    # and the process histogram of proxy latencies is exposed too
    assert "claw_proxy_request_duration_seconds" in families


def test_metrics_with_an_admin_key(admin_key):
    assert scrape(Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {admin_key}"))


def test_metrics_queue_depth_is_read_from_redis(settings):
    if not settings.REDIS_URL:
        pytest.skip("needs REDIS_URL (the CI's PostgreSQL + Redis run)")
    settings.CLAW_METRICS_TOKEN = "t"
    families = scrape(Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t"))
    (sample,) = families["claw_celery_queue_length"]
    assert sample.labels == {"queue": settings.CELERY_TASK_DEFAULT_QUEUE} and sample.value >= 0


# --- request logs and the proxy histogram ------------------------------------------------------
async def call(app, path: str, headers: list[tuple[bytes, bytes]] = ()) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "headers": list(headers)}
    await RequestLogMiddleware(app)(scope, receive, send)
    return sent


async def teapot(scope, receive, send):
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b"a", "more_body": True})
    await send({"type": "http.response.body", "body": b"b"})


def histogram_count(route: str, status: str) -> float:
    for family in metrics.PROXY_LATENCY.collect():
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels == {"route": route, "status": status}:
                return sample.value
    return 0.0


def test_every_request_gets_an_id_a_log_line_and_gateway_calls_a_latency(caplog):
    before = histogram_count("/t/", "4xx")
    # when a gateway call (a capability URL, whose token must not be logged) is served
    with caplog.at_level(logging.INFO, logger="claw.request"):
        sent = asyncio.run(call(teapot, "/t/c/SECRET-TOKEN/t1/-/v1/chat/completions"))
    # then the response carries a new request id, one record describes the request...
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    request_id = dict(start["headers"])[b"x-request-id"].decode()
    assert len(request_id) == 32
    (record,) = [r for r in caplog.records if r.name == "claw.request"]
    assert record.request_id == request_id and record.status == 418 and record.method == "GET"
    assert record.duration_ms >= 0 and "SECRET-TOKEN" not in record.path + record.getMessage()
    # ...and the gateway latency histogram counted it once, when the last byte was sent
    assert histogram_count("/t/", "4xx") == before + 1


def test_a_safe_client_request_id_is_kept_and_an_unsafe_one_replaced(caplog):
    with caplog.at_level(logging.INFO, logger="claw.request"):
        kept = asyncio.run(call(teapot, "/api/v1/steps", [(b"x-request-id", b"trace-42.a")]))
        replaced = asyncio.run(call(teapot, "/api/v1/steps", [(b"x-request-id", b"bad id\xff")]))
    assert dict(kept[0]["headers"])[b"x-request-id"] == b"trace-42.a"
    assert dict(replaced[0]["headers"])[b"x-request-id"] != b"bad id\xff"


def test_json_formatter_writes_one_object_per_record():
    # given a request record and an error with a traceback
    record = logging.LogRecord("claw.request", logging.INFO, __file__, 1, "GET %s", ("/x",), None)
    record.request_id, record.path, record.status, record.duration_ms = "r1", "/x", 200, 1.5
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        error = logging.LogRecord("pool", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    # when they are formatted
    line, error_line = JsonFormatter().format(record), JsonFormatter().format(error)
    # then each is one line of JSON with the fields
    assert "\n" not in line and "\n" not in error_line
    entry = json.loads(line)
    assert entry["level"] == "INFO" and entry["logger"] == "claw.request" and entry["message"] == "GET /x"
    assert entry["time"].endswith("Z") and entry["request_id"] == "r1" and entry["status"] == 200
    assert "ValueError: boom" in json.loads(error_line)["exc_info"]


# --- security headers ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/login/", "/api/v1/docs/", "/healthz"])
def test_pages_carry_the_security_headers(path):
    resp = Client().get(path)
    assert resp.status_code == 200
    assert resp["X-Content-Type-Options"] == "nosniff"
    assert resp["Referrer-Policy"] == "same-origin"
    assert resp["X-Frame-Options"] == "DENY"
    csp = resp["Content-Security-Policy"]
    assert "script-src 'self';" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp


PAGES = [
    "/login/",
    "/api/v1/docs/",
    "/",
    "/trajectories/",
    "/curation/",
    "/review/",
    "/admin/",
    "/admin/pool/apikey/",
    # the browsable API (HTML for a browser), a list with filters and a detail
    "/api/v1/steps",
    "/api/v1/trajectories",
    "/api/v1/datasets",
]


def test_pages_have_no_inline_script_or_style(operator):
    # the CSP allows the site's own files only: every page and the API docs comply (JSON data
    # blocks are not scripts: the CSP does not apply to them)
    client = Client()
    client.force_login(operator)
    for path in PAGES:
        resp = client.get(path, follow=True, HTTP_ACCEPT="text/html")
        assert resp.status_code == 200, path
        assert resp["Content-Type"].startswith("text/html"), path
        html = resp.content.decode()
        for tag in html.split("<script")[1:]:
            attrs = tag.split(">", 1)[0]
            assert "src=" in attrs or 'type="application/json"' in attrs, (path, tag[:80])
        assert "<style" not in html and " style=" not in html, path


# --- serve in production ------------------------------------------------------------------------
def test_serve_without_upstream_or_demo_starts_no_demo_and_says_so(settings, monkeypatch, caplog, tmp_path):
    # given production's switches: demo off, no upstream, and a multiprocess metrics folder
    settings.CLAW_DEMO = False
    settings.CLAW_UPSTREAM_URL = ""
    prom = tmp_path / "prom"
    prom.mkdir()
    (prom / "stale_123.db").write_bytes(b"x")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom))
    monkeypatch.setattr(serve, "run_uvicorn", lambda app, options, **kw: True)
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **kw: started.append(a))
    handler = signal.getsignal(signal.SIGTERM)
    # when serve runs
    out = io.StringIO()
    try:
        with caplog.at_level(logging.WARNING):
            call_command("serve", port=0, stdout=out)
    finally:
        signal.signal(signal.SIGTERM, handler)
    # then no demo process started, it says the gateway has no upstream, stale samples are gone
    assert started == []
    messages = [r.getMessage() for r in caplog.records]
    assert any("No CLAW_UPSTREAM_URL" in m for m in messages)
    assert not list(prom.glob("*.db"))
    # and in embedded mode it says that tasks run eagerly in-process
    if settings.CELERY_TASK_ALWAYS_EAGER:
        assert "Celery tasks run eagerly" in out.getvalue()


def test_serve_names_eager_tasks_in_embedded_mode(settings, monkeypatch, caplog):
    """Embedded mode is what `make run` is for, so serve says so as a note on its output, not
    as a logged warning (issue [15/17]: startup prints no warning the user did not cause)."""
    settings.CLAW_DEMO = False
    settings.CELERY_TASK_ALWAYS_EAGER = True
    monkeypatch.setattr(serve, "run_uvicorn", lambda app, options, **kw: True)
    handler = signal.getsignal(signal.SIGTERM)
    out = io.StringIO()
    try:
        with caplog.at_level(logging.WARNING):
            call_command("serve", port=0, stdout=out)
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert "Celery tasks run eagerly" in out.getvalue()
    assert not [r.getMessage() for r in caplog.records if "eager" in r.getMessage()]  # a note only
