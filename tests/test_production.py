"""Production settings and topology: required variables, `check --deploy`, the Procfile, and
nothing created on disk by importing the settings."""

from __future__ import annotations

import importlib
import os
import secrets
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from claw_site.celery import app as celery_app

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {
    # Never connected to by these tests: nothing listens on port 1.
    "DATABASE_URL": "postgres://claw@127.0.0.1:1/claw",
    "REDIS_URL": "redis://127.0.0.1:1/0",
    "DJANGO_SECRET_KEY": secrets.token_urlsafe(60),
}


def run_python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "CLAW_"))}
    clean.pop("DATABASE_URL", None)
    clean.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, *(["-c", code] if code else []), *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_production_refuses_to_start_without_a_required_variable(monkeypatch, missing):
    # given the production environment without one variable
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv(missing)
    sys.modules.pop("claw_site.settings.production", None)
    # when the production settings are loaded
    # then they refuse, naming the variable
    with pytest.raises(ImproperlyConfigured, match=missing):
        importlib.import_module("claw_site.settings.production")
    sys.modules.pop("claw_site.settings.production", None)


def test_check_deploy_is_clean(tmp_path):
    # given the required variables and nothing else
    env = {
        **REQUIRED,
        "DJANGO_SETTINGS_MODULE": "claw_site.settings.production",
        "CLAW_VAR_DIR": str(tmp_path / "var"),
    }
    # when Django's deployment checks run
    proc = run_python("", env, "manage.py", "check", "--deploy", "--fail-level", "WARNING")
    # then there is no warning at all, and the settings created no folder
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no issues" in proc.stdout and "WARNING" not in proc.stderr, proc.stdout + proc.stderr
    assert not (tmp_path / "var").exists()


def test_production_values(tmp_path):
    # given the production settings
    env = {**REQUIRED, "CLAW_DEMO": "1", "CLAW_VAR_DIR": str(tmp_path / "var")}
    code = (
        "import json; from claw_site.settings import production as p; print(json.dumps({"
        "'demo': p.CLAW_DEMO, 'debug': p.DEBUG, 'eager': p.CELERY_TASK_ALWAYS_EAGER, "
        "'log': p.LOGGING['handlers']['console']['formatter'], 'hsts': p.SECURE_HSTS_SECONDS, "
        "'proxy': list(p.SECURE_PROXY_SSL_HEADER), 'redirect': p.SECURE_SSL_REDIRECT, "
        "'engine': p.DATABASES['default']['ENGINE']}))"
    )
    proc = run_python(code, env)
    assert proc.returncode == 0, proc.stderr
    import json

    values = json.loads(proc.stdout)
    # then the demo is off even when asked for, logs are JSON and the rest is hardened
    assert values == {
        "demo": False,
        "debug": False,
        "eager": False,
        "log": "json",
        "hsts": 365 * 24 * 3600,
        "proxy": ["HTTP_X_FORWARDED_PROTO", "https"],
        "redirect": True,
        "engine": "django.db.backends.postgresql",
    }


def test_importing_the_settings_creates_no_folder(tmp_path):
    # given a var folder that does not exist
    var = tmp_path / "var"
    # when every settings module is imported (the embedded defaults: SQLite under var/)
    proc = run_python(
        "import claw_site.settings.local, claw_site.settings.test; "
        "from claw_site.settings import local; print(local.DATABASES['default']['NAME'])",
        {"CLAW_VAR_DIR": str(var)},
    )
    # then nothing was created; the SQLite backend creates it on first connection instead
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(var / "claw.sqlite3")
    assert not var.exists()
    proc = run_python(
        "import django; django.setup(); from django.db import connection; connection.ensure_connection()",
        {"CLAW_VAR_DIR": str(var), "DJANGO_SETTINGS_MODULE": "claw_site.settings.local"},
    )
    assert proc.returncode == 0, proc.stderr
    assert (var / "claw.sqlite3").exists()


def procfile() -> dict[str, str]:
    entries = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def test_the_procfile_runs_the_app_workers_and_beat():
    # given the Procfile
    entries = procfile()
    # then it lists the ASGI app with N workers, a Celery worker, one beat and the migration
    assert set(entries) == {"release", "web", "worker", "beat"}
    assert "manage.py serve" in entries["web"] and "--workers ${CLAW_WORKERS" in entries["web"]
    assert "--host 0.0.0.0" in entries["web"] and "PROMETHEUS_MULTIPROC_DIR" in entries["web"]
    assert shlex.split(entries["worker"])[:4] == ["celery", "-A", "claw_site", "worker"]
    assert shlex.split(entries["beat"])[:4] == ["celery", "-A", "claw_site", "beat"]
    assert "migrate" in entries["release"]


def test_beat_schedule_tasks_are_registered_with_the_worker_app(settings):
    # given the periodic sweeps beat sends (lease expiry; readiness, which also abandons idle
    # trajectories; the outbox relay, which sends tasks a broker outage left behind; retention,
    # which runs the enabled policies; the checkpoint index, which links new checkpoints to
    # the steps they trained; the fold of the pool's counter rows)
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert scheduled == {
        "pool.readiness_sweep",
        "pool.counters_compact",
        "curation.leases_expire",
        "pool.outbox_relay",
        "curation.retention_sweep",
        "curation.checkpoints_index",
        "curation.dataset_counts_sweep",
    }
    # then the worker app knows each one by name
    celery_app.loader.import_default_modules()
    assert scheduled <= set(celery_app.tasks)
