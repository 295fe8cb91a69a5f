"""Settings of the django-leasequeue test project (PostgreSQL from environment variables).

Environment: LEASEQUEUE_DB_NAME (default "leasequeue"), PGHOST (127.0.0.1), PGPORT (5432),
PGUSER (postgres), PGPASSWORD (empty). PGHOST and PGPORT may be libpq's comma-separated lists of a
primary and its standbys ("127.0.0.1,127.0.0.1", "5432,5433"), with
LEASEQUEUE_DB_TARGET_SESSION_ATTRS=read-write so that only the server accepting writes is used.
TESTPROJECT_TRANSACTION_POOLING=1 when PGHOST/PGPORT is a PgBouncer in transaction mode.
TESTPROJECT_TRACE_FILE=<path>: every process installs OpenTelemetry's SDK tracer provider, whose
spans go to that file as JSON lines (qa.otel; the otel extra and opentelemetry-sdk needed).
"""

import json
import os
import time
from pathlib import Path

import django
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "leasequeue-test-project-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_leasequeue",
    "invoices",
    "qa",
    "flowlab",
]
if django.VERSION < (6, 0):
    # Django 5.2 LTS: Django's tasks framework comes from the django-tasks backport.
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

# The tests' own database. Its name must start with "test_": the process tests refuse to start
# commands on any other database (tests/conftest.py), so that no test ever writes to a real one.
_TEST_DB_NAME = os.environ.get("LEASEQUEUE_TEST_DB_NAME") or None
if _TEST_DB_NAME is not None and not _TEST_DB_NAME.startswith("test_"):
    raise ImproperlyConfigured(f"LEASEQUEUE_TEST_DB_NAME={_TEST_DB_NAME!r} must start with 'test_' "
                               "(unset, the tests use test_<LEASEQUEUE_DB_NAME>)")

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("LEASEQUEUE_DB_NAME", "leasequeue"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "CONN_MAX_AGE": 600,
        "TEST": {"NAME": _TEST_DB_NAME},
    }
}
_DB_OPTIONS: dict[str, str | int] = {}
# Behind PgBouncer in transaction mode (tests/pgbouncer): a server-side cursor (QuerySet.iterator())
# declared WITH HOLD outside a transaction would outlive it on a server connection the next
# transaction may not get.
if os.environ.get("TESTPROJECT_TRANSACTION_POOLING"):
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
# Tests and the testing helpers shift the database clock of worker processes through this.
if os.environ.get("LEASEQUEUE_CLOCK_OFFSET"):
    _DB_OPTIONS["options"] = f"-c leasequeue.clock_offset={os.environ['LEASEQUEUE_CLOCK_OFFSET']}"
# Failover: with several hosts in PGHOST/PGPORT, libpq tries them in order and keeps the first whose
# session type fits ("read-write": the primary), on every new connection, the reconnects after a
# failover included.
if os.environ.get("LEASEQUEUE_DB_TARGET_SESSION_ATTRS"):
    _DB_OPTIONS["target_session_attrs"] = os.environ["LEASEQUEUE_DB_TARGET_SESSION_ATTRS"]
# Prepared statements allowed on the connection (psycopg prepare_threshold; Django's default is None,
# none): the one-job enqueue INSERT is then prepared (store._db._run_prepared).
if os.environ.get("LEASEQUEUE_DB_PREPARE_THRESHOLD"):
    _DB_OPTIONS["prepare_threshold"] = int(os.environ["LEASEQUEUE_DB_PREPARE_THRESHOLD"])
if _DB_OPTIONS:
    DATABASES["default"]["OPTIONS"] = _DB_OPTIONS

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LEASEQUEUE = {
    "LEASE": float(os.environ.get("LEASEQUEUE_LEASE", "30")),
    "POLL_INTERVAL": float(os.environ.get("LEASEQUEUE_POLL_INTERVAL", "1")),
    "REAPER_INTERVAL": float(os.environ.get("LEASEQUEUE_REAPER_INTERVAL", "5")),
    "SHUTDOWN_GRACE": float(os.environ.get("LEASEQUEUE_SHUTDOWN_GRACE", "10")),
    "BACKOFF_BASE": float(os.environ.get("LEASEQUEUE_BACKOFF_BASE", "1")),
    "BACKOFF_MAX": 60,
    # Prefetch window (seconds; the library's default when unset). The chaos suite widens it for
    # one worker so that it surely holds prefetched jobs when a fault hits it.
    "PREFETCH_WAIT": float(os.environ.get("LEASEQUEUE_PREFETCH_WAIT", "0.05")),
    # Bearer token for /leasequeue/metrics (None: staff sessions only).
    "METRICS_TOKEN": os.environ.get("LEASEQUEUE_METRICS_TOKEN") or None,
    # Framework (@django.tasks.task) tasks live outside tasks.py; workers import this module too.
    # LEASEQUEUE_EXTRA_TASKS=1 gives a worker qa.deploy_tasks too: the newer worker of a rolling
    # deploy, side by side with one that does not know those tasks.
    # TESTPROJECT_TRACE_FILE (the process test of traces, qa.otel) gives it qa.traced_tasks.
    # LEASEQUEUE_ASYNC_TASKS=1 gives it qa.async_tasks (async def handlers; elsewhere they would make
    # every worker of the test session claim for its event loop too).
    "IMPORTS": ["invoices.framework_tasks", *(["qa.deploy_tasks"] if os.environ.get("LEASEQUEUE_EXTRA_TASKS") else []),
                *(["qa.traced_tasks"] if os.environ.get("TESTPROJECT_TRACE_FILE") else []),
                *(["qa.async_tasks"] if os.environ.get("LEASEQUEUE_ASYNC_TASKS") else [])],
    # Seconds before a job of a task no live worker knows is dead-lettered (0 in the tests of that).
    "UNKNOWN_TASK_GRACE": float(os.environ.get("LEASEQUEUE_UNKNOWN_TASK_GRACE", "300")),
    # Queue options as JSON, e.g. '{"rated": {"rate_limit": "20/s"}}' (flow-control tests).
    # The TASKS queues below stay allowed (system check leasequeue.E103).
    # The maintenance tests: a short cadence and alive threshold, so that failover shows in seconds.
    "MAINTENANCE_INTERVAL": float(os.environ.get("LEASEQUEUE_MAINTENANCE_INTERVAL", "60")),
    "PROCESS_ALIVE_WITHIN": (float(os.environ["LEASEQUEUE_PROCESS_ALIVE_WITHIN"])
                             if os.environ.get("LEASEQUEUE_PROCESS_ALIVE_WITHIN") else None),
    "QUEUES": ({"default": {}, "invoices": {}, **json.loads(os.environ["LEASEQUEUE_QUEUES"])}
               if os.environ.get("LEASEQUEUE_QUEUES") else None),
}

# Django's tasks framework (django.tasks, or the django_tasks backport on 5.2) runs on our workers.
TASKS = {
    "default": {
        "BACKEND": "django_leasequeue.backends.LeaseQueueBackend",
        "QUEUES": ["default", "invoices"],
        "OPTIONS": {"MAX_ATTEMPTS": 5, "BACKOFF": {"base": 1, "max": 60}},
    }
}

# Recurring schedules (docs/howto/schedules.md), synced into the schedule table when a scheduler starts
# (`manage.py runscheduler`, `runworker --with-scheduler`) or by `manage.py syncschedules`. These
# are owned by settings: edits in the admin are overwritten at the next sync.
LEASEQUEUE_SCHEDULES = {
    # Every night at 02:00 Berlin time: enqueue this month's invoice for every account. The invoice
    # jobs have unique keys per (account, month), so the nights after the first are no-ops.
    "nightly-invoice-run": {
        "task": "invoices.tasks.run_monthly_invoices",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "catch_up": "latest",
    },
    # Every minute: a liveness probe through the whole pipeline (scheduler -> queue -> worker).
    "heartbeat": {
        "task": "invoices.tasks.heartbeat",
        "cron": "* * * * *",
        "catch_up": "none",
        "priority": 50,
    },
}
if os.environ.get("LEASEQUEUE_HEARTBEAT_INTERVAL"):
    LEASEQUEUE["HEARTBEAT_INTERVAL"] = float(os.environ["LEASEQUEUE_HEARTBEAT_INTERVAL"])
# Timeouts: the stuck-handler bounds, the interruption bound and the execution mode, for process tests.
if os.environ.get("LEASEQUEUE_STUCK_HANDLERS_MAX"):
    LEASEQUEUE["STUCK_HANDLERS_MAX"] = int(os.environ["LEASEQUEUE_STUCK_HANDLERS_MAX"])
if os.environ.get("LEASEQUEUE_STUCK_EXIT_AFTER"):
    LEASEQUEUE["STUCK_EXIT_AFTER"] = float(os.environ["LEASEQUEUE_STUCK_EXIT_AFTER"])
if os.environ.get("LEASEQUEUE_MAX_INTERRUPTIONS"):
    LEASEQUEUE["MAX_INTERRUPTIONS"] = int(os.environ["LEASEQUEUE_MAX_INTERRUPTIONS"])
if os.environ.get("LEASEQUEUE_EXECUTION"):
    LEASEQUEUE["EXECUTION"] = os.environ["LEASEQUEUE_EXECUTION"]
# The failover test of ASYNC_COMPLETIONS: completion batches committed with synchronous_commit off.
if os.environ.get("LEASEQUEUE_ASYNC_COMPLETIONS"):
    LEASEQUEUE["ASYNC_COMPLETIONS"] = os.environ["LEASEQUEUE_ASYNC_COMPLETIONS"] == "1"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LEASEQUEUE_LOG_LEVEL", "WARNING")},
}

# Process tests of EXECUTION = "process": every process that loads these settings (the worker, and
# each child that sets Django up for one handler) takes this many seconds longer, so that a child is
# reliably still setting up when a test acts.
if os.environ.get("TESTPROJECT_SLOW_SETUP"):
    time.sleep(float(os.environ["TESTPROJECT_SLOW_SETUP"]))
