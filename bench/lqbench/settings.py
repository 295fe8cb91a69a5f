"""Settings of the benchmark project: the smallest Django project that runs django-leasequeue.

Environment (set by ``bench/run.py`` and by the peers-harness adapter):

* ``LQBENCH_DB``: database name (default ``leasequeue_bench``); ``PGHOST``, ``PGPORT``, ``PGUSER``,
  ``PGPASSWORD`` as for libpq.
* ``LQBENCH_LEASE`` (seconds, default 30), ``LQBENCH_POLL_INTERVAL`` (default 1).
* ``LQBENCH_ASYNC_COMPLETIONS=1``: ``LEASEQUEUE["ASYNC_COMPLETIONS"] = True`` (completion batches
  commit with ``synchronous_commit = off``; see docs/howto/performance.md).
* ``LQBENCH_PREPARED_STATEMENTS=0``: ``LEASEQUEUE["PREPARED_STATEMENTS"] = False`` (claims and the
  one-job enqueue parsed and planned on every call; on by default).
* ``LQBENCH_ASYNC_SLOTS=N``: ``LEASEQUEUE["ASYNC_SLOTS"] = N`` (0: the worker claims no async job, as
  one without ``async def`` tasks does).
* ``LQBENCH_NOTIFY=0``: no NOTIFY on enqueue either (the worker side uses ``--no-notify``).
* ``LQBENCH_TRANSACTION_POOLING=1``: ``PGHOST``/``PGPORT`` is a PgBouncer in transaction mode
  (server-side cursors off: one declared outside a transaction would outlive it on a server
  connection the next transaction may not get).
* ``LQBENCH_CLAIM_TIMES=DIR``: record each claim statement's time (``lqbench/apps.py``).
* ``LQBENCH_PREPARE=1``: ``OPTIONS["prepare_threshold"] = 5``, which allows prepared statements on
  the connection: the one-job enqueue INSERT is then prepared (Django's own queries, bound
  client-side, are not; see docs/howto/performance.md).
"""

import os

SECRET_KEY = "leasequeue-benchmark-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["django_leasequeue", "lqbench"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("LQBENCH_DB", "leasequeue_bench"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        # Workers keep their connections (they never call close_old_connections per job anyway).
        "CONN_MAX_AGE": None,
    }
}
if os.environ.get("LQBENCH_PREPARE") == "1":
    DATABASES["default"]["OPTIONS"] = {"prepare_threshold": 5}

LEASEQUEUE = {
    "LEASE": float(os.environ.get("LQBENCH_LEASE", "30")),
    "POLL_INTERVAL": float(os.environ.get("LQBENCH_POLL_INTERVAL", "1")),
    "NOTIFY": os.environ.get("LQBENCH_NOTIFY", "1") == "1",
    "SHUTDOWN_GRACE": 5,
}
if os.environ.get("LQBENCH_TRANSACTION_POOLING") == "1":
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
if os.environ.get("LQBENCH_FAIR") == "1":  # the flow section's fair-claiming drain
    LEASEQUEUE["QUEUES"] = {"default": {"fair": True}}
if os.environ.get("LQBENCH_ASYNC_COMPLETIONS") == "1":
    LEASEQUEUE["ASYNC_COMPLETIONS"] = True
if os.environ.get("LQBENCH_PREPARED_STATEMENTS") == "0":
    LEASEQUEUE["PREPARED_STATEMENTS"] = False
if os.environ.get("LQBENCH_ASYNC_SLOTS"):
    LEASEQUEUE["ASYNC_SLOTS"] = int(os.environ["LQBENCH_ASYNC_SLOTS"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LQBENCH_LOG_LEVEL", "WARNING")},
}
