"""Settings shared by every environment, configured from the environment.

Embedded defaults (no variables set): SQLite under ./var/, Celery tasks executed in-process,
an in-memory channel layer. With DATABASE_URL and REDIS_URL set, the same code runs on
PostgreSQL, a Redis-brokered Celery worker pool and the Redis channel layer.
"""

import json
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = Path(os.environ.get("CLAW_VAR_DIR", BASE_DIR / "var"))


# Typed environment variables. Unset or empty means the default; anything else must parse,
# or the process stops at start with the variable named (a typo never silently turns a switch
# off). Hand-written rather than environs or django-environ: see docs/architecture.md
# ("Hand-written infrastructure, and why").
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ImproperlyConfigured(
        f"{name}={os.environ[name]!r} is not a boolean (1/0, true/false, yes/no, on/off)"
    )


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None


# --- Core -----------------------------------------------------------------------------------
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "insecure-dev-key-change-me-in-production")
DEBUG = env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [
    h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver").split(",") if h
]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "claw_site.admin_site.ClawAdminConfig",  # django.contrib.admin, refusing reviewers with a 403
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "pool",
    "gateway",
    "curation",
    "claw_site",  # the composition root: its `serve` command
    "django.contrib.humanize",  # intcomma: thousands separators on every page's big numbers
]

# Every middleware here is async-capable, so async gateway views never hop to a thread.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "claw_site.security.ContentSecurityPolicyMiddleware",
    # A database outage is a 503 with Retry-After (claw_site/middleware.py).
    "claw_site.middleware.DatabaseUnavailableMiddleware",
    # An unmatched API path is a JSON 404, never the DEBUG page listing the routes.
    "claw_site.middleware.JsonNotFoundMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "claw_site.urls"
ASGI_APPLICATION = "claw_site.asgi.application"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # ``replica``: whether the page was read from the replica, and its lag.
                "pool.replica.replica_context",
            ],
        },
    }
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = os.environ.get("DATABASE_URL", "")
if DATABASE_URL:
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    if DATABASES["default"]["ENGINE"].endswith("postgresql") and env_bool("CLAW_DB_POOL", True):
        # Under ASGI each sync view runs on a fresh thread, so per-thread persistent
        # connections are never reused: every API request would pay a PostgreSQL connect
        # (a backend fork). A process-wide psycopg pool hands connections across threads.
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 2,
            "max_size": env_int("CLAW_DB_POOL_SIZE", 20),
            # Waiting longer for a connection than a client waits for an answer helps no one:
            # during a database outage requests fail fast with 503 and Retry-After.
            "timeout": env_float("CLAW_DB_POOL_TIMEOUT", 5.0),
        }
    if DATABASES["default"]["ENGINE"].endswith("postgresql") and env_bool(
        "CLAW_DB_PREPARE", env_bool("CLAW_PROXY_PREPARED_STATEMENTS", True)
    ):
        # The pool's hot raw statements are prepared on the server the second time a connection
        # runs them (pool/prepared.py); Django's own cursors bind client-side and never prepare.
        # Off (CLAW_DB_PREPARE=0) behind a pooler in transaction mode that cannot keep
        # prepared statements (PgBouncer before 1.21); CLAW_PROXY_PREPARED_STATEMENTS, its
        # earlier name (then for the proxy's write alone), is read when it is unset.
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 1
else:
    # Nothing is created at import: claw_site.sqlite (Django's SQLite backend) creates VAR_DIR
    # when it opens the first connection.
    DATABASES = {
        "default": {
            "ENGINE": "claw_site.sqlite",
            "NAME": VAR_DIR / "claw.sqlite3",
            "OPTIONS": {
                # IMMEDIATE takes the write lock at BEGIN, so concurrent writers queue on the
                # busy timeout instead of failing with "database is locked" mid-transaction.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

# A PostgreSQL streaming replica of DATABASE_URL (a hot standby, e.g. built with
# pg_basebackup): pages, previews, the admin's lists, snapshot builds and the list/stats
# selectors read from it; writes and every read that must see a write stay on the primary
# (pool/replica.py, docs/operations.md "A read replica"). Unset: one database, no change.
# Never migrated (it replays the primary); in tests it mirrors the test database.
DATABASE_REPLICA_URL = os.environ.get("DATABASE_REPLICA_URL", "").strip()
if DATABASE_REPLICA_URL:
    _replica = dj_database_url.parse(DATABASE_REPLICA_URL, conn_max_age=0)
    if not (
        DATABASES["default"]["ENGINE"].endswith("postgresql") and _replica["ENGINE"].endswith("postgresql")
    ):
        raise ImproperlyConfigured(
            "DATABASE_REPLICA_URL must name a PostgreSQL replica of DATABASE_URL's PostgreSQL database"
        )
    _options = DATABASES["default"].get("OPTIONS", {})
    _replica["OPTIONS"] = {k: dict(v) if isinstance(v, dict) else v for k, v in _options.items()}
    _replica["TEST"] = {"MIRROR": "default"}
    DATABASES["replica"] = _replica
# Inert without the replica: it sends reads to it only inside a read path that asks.
DATABASE_ROUTERS = ["pool.replica.ReplicaRouter"]
# How long a snapshot build waits for the replica to replay its frozen step ids before it
# reads them from the primary instead.
CLAW_REPLICA_WAIT_SECONDS = env_float("CLAW_REPLICA_WAIT_SECONDS", 10.0)

# --- Cache, tasks and channel layer -------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "")

if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
    # CLAW_CHANNEL_PREFIX: the layer's key prefix (channels_redis' default "asgi"). Two
    # deployments sharing one Redis database give each its own, or each dashboard shows the
    # other's events.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": os.environ.get("CLAW_CHANNEL_PREFIX") or "asgi"},
        }
    }
else:
    # Embedded mode: no broker. Tasks run in-process at enqueue time (which is always
    # transaction.on_commit), so the code path is the same as with a worker. Eager apply_async
    # still takes a producer from kombu's in-memory transport (nothing leaves the process); the
    # hostname is given so kombu does not warn "No hostname was supplied".
    CELERY_BROKER_URL = "memory://localhost/"
    CELERY_TASK_ALWAYS_EAGER = True
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Live dashboard events (pool/live.py): published after commit into a process-local buffer,
# coalesced and sent through the channel layer above at most once per topic per tick. With
# the in-memory layer only consumers of the same process receive them; with REDIS_URL every
# process (web workers, Celery workers) publishes to all connected dashboards.
CLAW_LIVE = env_bool("CLAW_LIVE", True)
CLAW_LIVE_TICK_MS = env_int("CLAW_LIVE_TICK_MS", 100)

CELERY_TASK_EAGER_PROPAGATES = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True  # a task killed mid-run is redelivered; all tasks are idempotent
# Acks late covers a dead worker, not a dead pool process under a living worker (the kernel's
# OOM killer picks the process doing the work): Celery then acknowledges the task as failed,
# and it is lost. Retrying it instead (after the task's default_retry_delay) is bounded by its
# max_retries, so a task that always kills its process does not loop forever.
CELERY_TASK_RETRY_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Publishing happens after the write committed (pool.tasks.enqueue_on_commit): with the
# broker down, give up after one quick attempt instead of stalling the request.
# A task taken by a worker that died before acknowledging it (killed, host lost) stays in
# Redis's "unacked" set and is redelivered once it was taken this many seconds ago, by a
# worker's periodic restore sweep (kombu's Redis transport: ``visibility_timeout``). A task
# still running past it is redelivered too: harmless (tasks are idempotent) but wasted work,
# so keep it above the longest task and the longest retry countdown (300 s).
CLAW_CELERY_VISIBILITY_TIMEOUT = env_int("CLAW_CELERY_VISIBILITY_TIMEOUT", 3600)


def redelivery_options(visibility_timeout: int) -> dict[str, int]:
    """kombu's Redis options for redelivering a dead worker's tasks after ``visibility_timeout``.

    Each worker sweeps for such tasks when it starts and then every ``unacked_restore_interval``
    seconds (kombu's default scans on every 10th 10 s tick, i.e. every 100 s): a dead worker's
    task is redelivered within the timeout plus one sweep (10 s at most). A sweep holds a Redis
    lock for its few milliseconds; a worker killed while holding it leaves it until it expires,
    and no worker sweeps meanwhile (kombu's default: 300 s, longer than a short timeout), so
    that delay is kept within a tenth of the timeout, 5 s at least. A second sweeper is
    harmless: each task is restored under a WATCH transaction, once."""
    return {
        "visibility_timeout": visibility_timeout,
        "unacked_restore_interval": max(1, min(10, visibility_timeout // 4)),
        "unacked_restore_throttle": 1,
        "unacked_mutex_expire": min(300, max(5, visibility_timeout // 10)),
    }


CELERY_BROKER_TRANSPORT_OPTIONS = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
    "socket_connect_timeout": 2,
    "socket_timeout": 10,
    **redelivery_options(CLAW_CELERY_VISIBILITY_TIMEOUT),
}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get(
    "CLAW_CELERY_QUEUE", "claw"
)  # isolates deployments sharing a Redis
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# Periodic work: celery beat runs this schedule when there is a broker (REDIS_URL); in
# embedded mode `serve` runs exactly the same entries itself, each task by name at its
# interval (claw_site/management/commands/serve.py, beat_schedule). The readiness sweep catches
# what an effect missed and abandons idle trajectories, so no group waits forever; leases
# expire; the outbox relay sends the tasks a process could not publish; the steps behind new
# checkpoints of training runs are indexed (a read that needs them indexes them first); the
# pool's counter rows are folded (pool/services/counters.py), and so are the counts kept per
# saved dataset (curation/services/counts.py).
CLAW_SWEEP_SECONDS = env_float("CLAW_SWEEP_SECONDS", 60.0)
# Retention (curation/services/retention.py): how often the enabled policies run, and how long
# a lease pins what it delivered (its replay window: GET /api/v1/leases/{id}/batch).
CLAW_RETENTION_SECONDS = env_float("CLAW_RETENTION_SECONDS", 3600.0)
CLAW_RETENTION_REPLAY_DAYS = env_float("CLAW_RETENTION_REPLAY_DAYS", 7.0)
# The share of its wall time a retention pass works (0 < duty <= 1): after each chunk it rests
# the chunk's time x (1 / duty - 1), as autovacuum's cost delay paces VACUUM, so a pass on a
# busy machine takes a smaller share of it for longer (curation/services/retention.py).
CLAW_RETENTION_DUTY = env_float("CLAW_RETENTION_DUTY", 1.0)
if not 0 < CLAW_RETENTION_DUTY <= 1:
    raise ImproperlyConfigured(f"CLAW_RETENTION_DUTY={CLAW_RETENTION_DUTY} must be in (0, 1]")
# The builder's live preview of an unsaved spec (curation/selectors/specs.py, dataset_preview):
# on a pool of more than twice this many groups or trajectories, estimated from a sample of
# about this many units, at a cost that does not grow with the pool; counted exactly below.
CLAW_PREVIEW_SAMPLE_UNITS = env_int("CLAW_PREVIEW_SAMPLE_UNITS", 1000)
# A consumer's oldest-first pull starts where its last one found the queue taken
# (curation/services/cursors.py), but never closer to now than this: a unit made ready by a
# transaction still in flight carries a ready time from before its commit. Longer is safer
# (a commit slower than this, or clocks further apart, leaves a unit behind the cursor until the
# next retention sweep moves it back);
# what a pull re-reads is what was taken in this window.
CLAW_PULL_CURSOR_LAG_SECONDS = env_float("CLAW_PULL_CURSOR_LAG_SECONDS", 120.0)
CELERY_BEAT_SCHEDULE = {
    "readiness-sweep": {"task": "pool.readiness_sweep", "schedule": CLAW_SWEEP_SECONDS},
    "counters-compact": {"task": "pool.counters_compact", "schedule": CLAW_SWEEP_SECONDS},
    "leases-expire": {"task": "curation.leases_expire", "schedule": CLAW_SWEEP_SECONDS},
    "outbox-relay": {"task": "pool.outbox_relay", "schedule": CLAW_SWEEP_SECONDS},
    "checkpoints-index": {"task": "curation.checkpoints_index", "schedule": CLAW_SWEEP_SECONDS},
    "dataset-counts": {"task": "curation.dataset_counts_sweep", "schedule": CLAW_SWEEP_SECONDS},
    "retention": {"task": "curation.retention_sweep", "schedule": CLAW_RETENTION_SECONDS},
}
# A process whose broker refused a task retries its outbox after this, doubling to 8x.
CLAW_OUTBOX_RETRY_SECONDS = env_float("CLAW_OUTBOX_RETRY_SECONDS", 2.0)

# --- serve (claw_site/management/commands/serve.py) --------------------------------------------
# Where `manage.py serve` listens (its --host, --port and --workers default to these), the
# demo upstream's port (0: PORT + 1) and the demo agents' pace, and uvicorn's log level.
CLAW_SERVE_HOST = os.environ.get("HOST", "").strip() or "127.0.0.1"
CLAW_SERVE_PORT = env_int("PORT", 8000)
CLAW_SERVE_WORKERS = env_int("CLAW_WORKERS", 1)
CLAW_DEMO_UPSTREAM_PORT = env_int("CLAW_DEMO_UPSTREAM_PORT", 0)
CLAW_DEMO_PACE_S = env_float("CLAW_DEMO_PACE_S", 1.0)
CLAW_UVICORN_LOG_LEVEL = os.environ.get("CLAW_UVICORN_LOG_LEVEL", "").strip() or "warning"
# Slow and greedy clients (claw_kit/web/slow_clients.py, the protocol serve runs uvicorn with):
# a request's headers must be complete within CLAW_HEADER_TIMEOUT_S; its body within
# CLAW_BODY_TIMEOUT_S of them, or past that keep arriving at a mean of at least
# CLAW_BODY_MIN_BYTES_PER_S (a 256 MB upload at 1 MB/s goes on; a trickle is cut); a client
# address may hold CLAW_MAX_CONNECTIONS_PER_IP connections at once per process (0: no bound;
# behind a reverse proxy every client is the proxy's address, so keep it above its pool).
# 0 turns a timeout off.
CLAW_HEADER_TIMEOUT_S = env_float("CLAW_HEADER_TIMEOUT_S", 10.0)
CLAW_BODY_TIMEOUT_S = env_float("CLAW_BODY_TIMEOUT_S", 30.0)
CLAW_BODY_MIN_BYTES_PER_S = env_float("CLAW_BODY_MIN_BYTES_PER_S", 1_000_000.0)
CLAW_MAX_CONNECTIONS_PER_IP = env_int("CLAW_MAX_CONNECTIONS_PER_IP", 1024)

# --- Security headers -----------------------------------------------------------------------
# SecurityMiddleware: nosniff and the referrer policy; XFrameOptionsMiddleware: DENY;
# claw_site.security: the CSP below (pages load only the site's own files). HTTPS redirect,
# HSTS and secure cookies are production's (settings/production.py).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
CLAW_CONTENT_SECURITY_POLICY = os.environ.get(
    "CLAW_CONTENT_SECURITY_POLICY",
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; font-src 'self'; "
    "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'",
)

# --- Static files -----------------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "claw_site" / "static"]
# Uploaded and generated files (dataset snapshots under snapshots/). FileSystemStorage creates
# the folders on first write, so nothing is created at import time.
MEDIA_ROOT = Path(os.environ.get("CLAW_MEDIA_ROOT", VAR_DIR / "media"))
MEDIA_URL = "/media/"  # never served directly: snapshots are downloaded through the API
# Steps a snapshot build reads, renders and writes per chunk (curation/services/snapshots.py):
# its memory bound (rows of up to CLAW_MAX_TOKENS_PER_STEP tokens) and progress granularity.
CLAW_SNAPSHOT_CHUNK_STEPS = env_int("CLAW_SNAPSHOT_CHUNK_STEPS", 1_000)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # Retention's archives (curation/services/retention.py): the filesystem under
    # CLAW_ARCHIVE_ROOT, or an S3-compatible bucket when CLAW_ARCHIVE_S3_BUCKET is set.
    "archives": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(Path(os.environ.get("CLAW_ARCHIVE_ROOT", VAR_DIR / "archives")))},
    },
}
if os.environ.get("CLAW_ARCHIVE_S3_BUCKET"):
    STORAGES["archives"] = {
        "BACKEND": "storages.backends.s3.S3Storage",
        "OPTIONS": {
            "bucket_name": os.environ["CLAW_ARCHIVE_S3_BUCKET"],
            "endpoint_url": os.environ.get("CLAW_ARCHIVE_S3_ENDPOINT_URL") or None,
            "access_key": os.environ.get("CLAW_ARCHIVE_S3_ACCESS_KEY") or None,
            "secret_key": os.environ.get("CLAW_ARCHIVE_S3_SECRET_KEY") or None,
            "region_name": os.environ.get("CLAW_ARCHIVE_S3_REGION") or None,
            "location": os.environ.get("CLAW_ARCHIVE_S3_PREFIX", "archives"),
            "file_overwrite": False,
        },
    }

# --- REST API -------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "pool.access.auth.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["pool.access.auth.ReadScope"],
    "DEFAULT_PARSER_CLASSES": ["claw_kit.web.parsers.FastJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "claw_kit.web.renderers.FastJSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "claw_kit.web.pagination.IdCursorPagination",
    "PAGE_SIZE": 100,
    "EXCEPTION_HANDLER": "claw_kit.web.exception_handler.api_exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["pool.access.throttling.ApiKeyRateThrottle"],
    # OPTIONS answers 405: DRF's metadata introspects a serializer that not every view has
    # (a 500 there), and no client needs it (no cross-origin callers).
    "DEFAULT_METADATA_CLASS": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Claw-R1 API",
    "DESCRIPTION": "Step-level data middleware for agentic RL.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "ENUM_NAME_OVERRIDES": {
        "RewardSourceEnum": "pool.models.Step.RewardSource",
        # Shared by TrajectorySerializer and TrajectoryOpenedSerializer.
        "TrajectoryStatusEnum": "pool.models.Trajectory.Status",
        # Ending a trajectory (complete, trajectory-completions).
        "TrajectoryEndStatusEnum": ["completed", "failed", "abandoned"],
        # Dataset filters (curation/specs.py) and step reads share these.
        "TokenSourceEnum": "pool.models.Step.TokenSource",
        "QualityFlagEnum": "pool.flags.QUALITY_NAMES",
        "OperatorLabelEnum": ["none", "accepted", "rejected", "quarantined"],
    },
    # The gateway's doors are plain Django views: claw_site/openapi.py documents them.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "claw_site.openapi.gateway_doors",
    ],
}

# --- Claw limits and gateway ----------------------------------------------------------------------
CLAW_MAX_TOKENS_PER_STEP = env_int("CLAW_MAX_TOKENS_PER_STEP", 262_144)
CLAW_MAX_STEPS_PER_BATCH = env_int("CLAW_MAX_STEPS_PER_BATCH", 1_000)
CLAW_MAX_BODY_BYTES = env_int("CLAW_MAX_BODY_BYTES", 256 * 1024 * 1024)
# The largest reward magnitude any door takes (steps, rewards, completions, token rewards,
# reward functions' scores): pool/ingest/rules.py check_reward.
CLAW_REWARD_ABS_MAX = env_float("CLAW_REWARD_ABS_MAX", 1e6)
# A proxied call's text (all its strings but images' data and URLs) is refused past this many
# characters before it goes upstream (gateway/proxy/limits.py): 16 per token of the step
# limit, far more than any tokenizer's average, so only a prompt no step could hold is cut.
CLAW_MAX_PROMPT_CHARS = env_int("CLAW_MAX_PROMPT_CHARS", 16 * CLAW_MAX_TOKENS_PER_STEP)
# The shape of every JSON / MessagePack body and field (claw_kit/web/guard.py): nesting depth,
# keys per object, items per array (above CLAW_MAX_TOKENS_PER_STEP, so token arrays fit).
CLAW_MAX_JSON_DEPTH = env_int("CLAW_MAX_JSON_DEPTH", 64)
CLAW_MAX_JSON_KEYS = env_int("CLAW_MAX_JSON_KEYS", 10_000)
CLAW_MAX_JSON_ITEMS = env_int("CLAW_MAX_JSON_ITEMS", 1_000_000)
# Per-API-key token bucket on the REST API (pool/access/throttling.py): sustained requests per
# second and burst size; 0 turns limits off. In Redis when REDIS_URL is set, else per process.
CLAW_RATE_LIMIT_PER_SECOND = env_float("CLAW_RATE_LIMIT_PER_SECOND", 50.0)
CLAW_RATE_LIMIT_BURST = env_int("CLAW_RATE_LIMIT_BURST", 500)
# Django's own form-data limit does not apply to our parsers; the body limit above does.
DATA_UPLOAD_MAX_MEMORY_SIZE = None
CLAW_API_KEY_CACHE_SECONDS = env_float("CLAW_API_KEY_CACHE_SECONDS", 1.0)
# Compiled reads (pool/compiled.py): also build each read and compare its SQL with the
# template's. On in the tests; benchmarks turn it off (bench/pgdb.py), as in production.
CLAW_COMPILED_CHECK = env_bool("CLAW_COMPILED_CHECK", False)
# POST /api/v1/policy-versions: a new current version may be at most this far above the
# current one (above 0 when there is none); further, or backwards, needs an admin's "force".
CLAW_POLICY_MAX_STEP = env_int("CLAW_POLICY_MAX_STEP", 1000)
# ... and a policy's current version may move at most this far within a minute, all calls
# together (429 policy_rate_limited past it; admins' "force" skips it): by default the same
# bound, so calling often does not get around the per-call one.
CLAW_POLICY_MAX_ADVANCE_PER_MINUTE = env_int("CLAW_POLICY_MAX_ADVANCE_PER_MINUTE", CLAW_POLICY_MAX_STEP)
# Lifetime of a trajectory capability URL's token (init_trajectory, POST /api/v1/trajectories);
# it also stops working as soon as its trajectory completes or is abandoned.
CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS = env_int("CLAW_TRAJECTORY_TOKEN_LIFETIME_SECONDS", 24 * 3600)

# --- Curation -------------------------------------------------------------------------------------
# A running trajectory without a new step for this long is abandoned by the sweep (its group
# then stops waiting for it).
CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS = env_int("CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS", 3600)
# Quality flag "too_long": responses longer than this many tokens.
CLAW_QUALITY_MAX_RESPONSE_TOKENS = env_int("CLAW_QUALITY_MAX_RESPONSE_TOKENS", 8192)
# How long a reviewer holds a claimed review item before another reviewer may take it.
CLAW_REVIEW_CLAIM_SECONDS = env_int("CLAW_REVIEW_CLAIM_SECONDS", 15 * 60)

CLAW_UPSTREAM_URL = os.environ.get("CLAW_UPSTREAM_URL", "")
CLAW_UPSTREAM_API_KEY = os.environ.get("CLAW_UPSTREAM_API_KEY", "")
CLAW_UPSTREAM_TIMEOUT = env_float("CLAW_UPSTREAM_TIMEOUT", 600.0)
# Idempotency-Key on proxied calls (pool/services/idempotency.py): a kept answer is replayed
# for this long; a claim still running past the second bound has an unknown outcome.
CLAW_IDEMPOTENCY_TTL_SECONDS = env_int("CLAW_IDEMPOTENCY_TTL_SECONDS", 24 * 3600)
CLAW_IDEMPOTENCY_RUNNING_SECONDS = env_float("CLAW_IDEMPOTENCY_RUNNING_SECONDS", CLAW_UPSTREAM_TIMEOUT + 60.0)
# HTTP client transport to the upstream: "fast" (claw_kit/llm/transport.py) or "httpx" (httpx's
# own httpcore pool, kept selectable so bench.transport can measure one against the other).
CLAW_UPSTREAM_TRANSPORT = os.environ.get("CLAW_UPSTREAM_TRANSPORT", "fast")
if CLAW_UPSTREAM_TRANSPORT not in ("fast", "httpx"):
    raise ImproperlyConfigured(
        f"CLAW_UPSTREAM_TRANSPORT must be fast or httpx, not {CLAW_UPSTREAM_TRANSPORT!r}"
    )
CLAW_TOKENIZER = os.environ.get("CLAW_TOKENIZER", "")
# Ask the upstream for the sampled tokens' logprobs on every call (the steps' rollout_logprobs;
# the agent gets them only when it asked itself): gateway/proxy/fields.py. Off: only the
# agent's own asks, and the other steps are flagged missing_logprobs.
CLAW_UPSTREAM_LOGPROBS = env_bool("CLAW_UPSTREAM_LOGPROBS", True)
# POST /v1/messages: "translate" (default) sends each call to the upstream's chat completions
# with return_token_ids (exact ids); "passthrough" forwards it to an upstream serving
# /v1/messages itself, whose answers carry no ids: its steps are retokenized with
# CLAW_TOKENIZER (token_source "retokenized"), or stored as untokenized_call Events.
CLAW_MESSAGES_UPSTREAM_MODE = os.environ.get("CLAW_MESSAGES_UPSTREAM_MODE", "translate")
if CLAW_MESSAGES_UPSTREAM_MODE not in ("translate", "passthrough"):
    raise ImproperlyConfigured(
        f"CLAW_MESSAGES_UPSTREAM_MODE must be translate or passthrough, not {CLAW_MESSAGES_UPSTREAM_MODE!r}"
    )
# Database threads per process for the async gateway (0 = 8 on PostgreSQL, 1 on SQLite).
CLAW_PROXY_DB_THREADS = env_int("CLAW_PROXY_DB_THREADS", 0)
# Proxied calls' steps committed together by one writer thread per process (a group commit);
# off: each call commits alone on the database threads.
CLAW_PROXY_GROUP_COMMIT = env_bool("CLAW_PROXY_GROUP_COMMIT", True)
CLAW_DEMO = env_bool("CLAW_DEMO", True)
# /metrics: a bearer token for the Prometheus scraper (admin-scope API keys work too).
CLAW_METRICS_TOKEN = os.environ.get("CLAW_METRICS_TOKEN", "")

# --- Computed rewards (pool/rewards/) ---------------------------------------------------------
# Data source (or dataset) -> dotted path of its reward function; RewardFunction rows in the
# admin override a name. CLAW_REWARD_FUNCTIONS (a JSON object) adds to or replaces these.
# verl's preprocessed datasets name their source "openai/gsm8k" and "lighteval/MATH".
CLAW_REWARD_FUNCTIONS = {
    "gsm8k": "pool.rewards.builtin.gsm8k",
    "openai/gsm8k": "pool.rewards.builtin.gsm8k",
    "math": "pool.rewards.builtin.math_boxed",
    "lighteval/MATH": "pool.rewards.builtin.math_boxed",
    "judge": "pool.rewards.judge.ruler",
    "exact": "pool.rewards.builtin.exact_match",
}
CLAW_REWARD_FUNCTIONS.update(json.loads(os.environ.get("CLAW_REWARD_FUNCTIONS") or "{}"))
# The LLM judge (pool/rewards/judge.py): the model it names upstream ("" = none) and its budget.
CLAW_JUDGE_MODEL = os.environ.get("CLAW_JUDGE_MODEL", "")
CLAW_JUDGE_MAX_TOKENS = env_int("CLAW_JUDGE_MAX_TOKENS", 2048)
# Claw-R1's POST /generate: max_tokens when the sampling params give none (its gateway's
# --response-length); 0 = send none (the upstream's default).
CLAW_GENERATE_MAX_TOKENS = env_int("CLAW_GENERATE_MAX_TOKENS", 0)

# --- Logging --------------------------------------------------------------------------------
# Every handler masks the secret of gateway and capability URL paths (/k/<api key>,
# /c/<token>: claw_kit/redaction.py). Django's and uvicorn's loggers are routed through these
# handlers, replacing the ones they bring, which would print paths unmasked; levels of the
# uvicorn loggers are left to uvicorn (--log-level, CLAW_UVICORN_LOG_LEVEL for `serve`, which
# hands this same configuration to uvicorn).
# CLAW_LOG_FORMAT: "text" (default here) or "json" (the production default).
CLAW_LOG_FORMAT = os.environ.get("CLAW_LOG_FORMAT", "").strip().lower() or "text"
if CLAW_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"CLAW_LOG_FORMAT must be text or json, not {CLAW_LOG_FORMAT!r}")
# One line per HTTP request (claw_site/requestlog.py) at INFO on the "claw.request" logger:
# off (WARNING: only 5xx) by default here, on in production.
CLAW_REQUEST_LOG_LEVEL = os.environ.get("CLAW_REQUEST_LOG_LEVEL", "WARNING")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact_secrets": {"()": "claw_kit.redaction.RedactSecrets"},
        "require_debug_false": {"()": "django.utils.log.RequireDebugFalse"},
    },
    "formatters": {
        # Client input in a message (a path, a uid) is escaped: a CR/LF in a URL cannot forge
        # a line (claw_kit/textlog.py).
        "text": {
            "()": "claw_kit.textlog.EscapingFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        # One JSON object per line (claw_kit/jsonlog.py): time, level, logger, message, and for
        # requests request_id, method, path, status, duration_ms.
        "json": {"()": "claw_kit.jsonlog.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": CLAW_LOG_FORMAT,
            "filters": ["redact_secrets"],
        },
        "mail_admins": {
            "class": "django.utils.log.AdminEmailHandler",
            "level": "ERROR",
            "filters": ["require_debug_false", "redact_secrets"],
        },
    },
    "root": {"handlers": ["console"], "level": os.environ.get("CLAW_LOG_LEVEL", "INFO")},
    "loggers": {
        "django": {"handlers": ["console", "mail_admins"], "level": "INFO", "propagate": False},
        "django.server": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "uvicorn": {"handlers": ["console"], "propagate": False},
        "uvicorn.error": {"propagate": True},  # named, so its level survives reconfiguration
        "uvicorn.asgi": {"propagate": True},
        "uvicorn.access": {"handlers": ["console"], "propagate": False},
        "claw.request": {"level": CLAW_REQUEST_LOG_LEVEL},
        # Per-request client logs (the demo agents, upstream forwarding) drown the useful lines.
        **{
            name: {"level": "WARNING"}
            for name in ("httpx", "httpx2", "httpcore", "openai", "celery.app.trace", "kombu.connection")
        },
    },
}
# Error reports (the DEBUG 500 page, mails to ADMINS) with the same secrets masked.
DEFAULT_EXCEPTION_REPORTER = "claw_site.error_reports.RedactingExceptionReporter"

# --- Sign-in -----------------------------------------------------------------------------------
# The pages' own sign-in page: reviewers are not staff, so the admin's would refuse them.
LOGIN_URL = "curation:login"
LOGIN_REDIRECT_URL = "curation:home"
LOGOUT_REDIRECT_URL = "curation:login"
# Passwords set through manage.py create_user (curation.services.user_create).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

# --- Media: images in steps (pool/media.py) -------------------------------------------
# Images are stored once by sha256 in STORAGES["default"] (above: the filesystem under
# MEDIA_ROOT, var/media by default; for an S3-compatible store install django-storages and set
# STORAGES["default"] = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {"bucket_name":
# ..., "endpoint_url": ...}}: nothing else changes). Per image: bytes and pixels (Pillow's
# decompression-bomb limit by default); per step: how many images.
CLAW_MEDIA_MAX_BYTES = env_int("CLAW_MEDIA_MAX_BYTES", 20 * 1024 * 1024)
CLAW_MEDIA_MAX_PIXELS = env_int("CLAW_MEDIA_MAX_PIXELS", 89_478_485)
CLAW_MEDIA_MAX_PER_STEP = env_int("CLAW_MEDIA_MAX_PER_STEP", 32)
# Token ids an upstream's prompt ids use for an image's placeholder run (e.g. 151655, Qwen2-VL's
# <|image_pad|>); comma-separated. Runs in order map to a step's images in order and give each
# StepMedia its token_start/token_end. Empty: spans are not recorded.
CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS = [
    int(x) for x in os.environ.get("CLAW_MEDIA_PLACEHOLDER_TOKEN_IDS", "151655").split(",") if x.strip()
]
