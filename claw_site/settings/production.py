"""Production: everything from the environment, nothing embedded.

The process refuses to start (ImproperlyConfigured naming the variable) without
DATABASE_URL (PostgreSQL), REDIS_URL (Celery broker, channel layer, rate limits) and
DJANGO_SECRET_KEY. The demo upstream and traffic are off. Logs are JSON lines.
`DJANGO_SETTINGS_MODULE=claw_site.settings.production manage.py check --deploy` is clean
(tests/test_production.py). See docs/operations.md, "Production".
"""

import os

from django.core.exceptions import ImproperlyConfigured

# Checked before base is read, so a missing variable is named instead of silently falling
# back to the embedded defaults (SQLite, in-process tasks, an in-memory channel layer).
for _name in ("DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"):
    if not os.environ.get(_name, "").strip():
        raise ImproperlyConfigured(f"{_name} must be set in production (claw_site.settings.production)")

from .base import *  # noqa: E402, F403
from .base import LOGGING, env_bool, env_int  # noqa: E402

# --- Core -----------------------------------------------------------------------------------
DEBUG = False
SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
# The demo upstream and agents never run in production: `serve` needs CLAW_UPSTREAM_URL for
# the OpenAI-compatible gateway, or runs without one and says so.
CLAW_DEMO = False

# --- HTTPS behind a reverse proxy -------------------------------------------------------------
# TLS ends at the load balancer, which must set X-Forwarded-Proto (and strip it from clients).
# CLAW_BEHIND_PROXY=0 when the app terminates TLS itself (no header is trusted then).
if env_bool("CLAW_BEHIND_PROXY", True):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    USE_X_FORWARDED_HOST = env_bool("DJANGO_USE_X_FORWARDED_HOST", False)
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
# Load-balancer probes and Prometheus scrape over plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
# Preloading is a submission to the browsers' lists that is hard to undo: opt in only.
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
if not SECURE_HSTS_PRELOAD:
    SILENCED_SYSTEM_CHECKS = ["security.W021"]  # "HSTS preload is off": deliberate, see above
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True

# --- Logging and request logs -----------------------------------------------------------------
CLAW_LOG_FORMAT = os.environ.get("CLAW_LOG_FORMAT", "").strip().lower() or "json"
if CLAW_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"CLAW_LOG_FORMAT must be text or json, not {CLAW_LOG_FORMAT!r}")
LOGGING["handlers"]["console"]["formatter"] = CLAW_LOG_FORMAT
LOGGING["loggers"]["claw.request"]["level"] = os.environ.get("CLAW_REQUEST_LOG_LEVEL", "INFO")
