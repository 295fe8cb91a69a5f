"""Django system checks: settings, database vendor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core import checks

from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report an invalid ``LEASEQUEUE`` setting as ``leasequeue.E001``."""
    from .conf import get_settings

    get_settings.cache_clear()
    try:
        get_settings()
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="leasequeue.E001")]
    return []


@checks.register()
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a non-PostgreSQL database for the job table as ``leasequeue.E002``.

    Registered without the ``database`` tag: the vendor is known from settings without connecting,
    so plain ``manage.py check`` (and ``runserver``) reports it, not only ``migrate``."""
    from django.db import connections, router

    from .models import Job

    alias = router.db_for_write(Job)
    if databases is not None and alias not in databases:
        return []
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        return [checks.Error(
            f"django-leasequeue needs PostgreSQL; database {alias!r} is {vendor!r}", id="leasequeue.E002"
        )]
    return []


# ---- monitoring ----
# The two checks below read the database. Like Django's own database checks they carry the
# ``database`` tag and do nothing unless Django passes the databases to check (``manage.py check
# --database default``, ``migrate``), so plain commands that may run without a database
# (``collectstatic`` in an image build) never connect. Both return nothing, instead of crashing,
# when the database cannot be reached. ``migrate`` runs them before it migrates; W101 stays quiet
# there (telling someone who is migrating to migrate is noise).

METRICS_TOKEN_MIN_LENGTH = 16


def _job_alias(databases: Any) -> str | None:
    from django.db import router

    from .models import Job

    alias = router.db_for_write(Job)
    if databases is None or alias not in databases:
        return None
    return alias


def pending_migrations(connection: BaseDatabaseWrapper) -> list[str] | None:
    """Names of django_leasequeue's migrations not applied on ``connection``, or None when the
    database cannot be read (unreachable, no permission). Never raises a database error."""
    from django.db import DatabaseError
    from django.db.migrations.loader import MigrationLoader

    try:
        loader = MigrationLoader(connection, ignore_no_migrations=True)
    except DatabaseError:
        return None
    app = "django_leasequeue"
    return sorted(name for (label, name) in loader.disk_migrations
                  if label == app and (label, name) not in loader.applied_migrations)


@checks.register(checks.Tags.database)
def check_migrations(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn (``leasequeue.W101``) when migrations of django_leasequeue are not applied.

    Workers on an unmigrated schema fail on their first claim, so say so before they start.
    Nothing is reported when the database is unreachable (the check must not crash ``check``).
    """
    import sys

    from django.db import connections

    alias = _job_alias(databases)
    if alias is None or sys.argv[1:2] == ["migrate"]:
        return []
    pending = pending_migrations(connections[alias])
    if not pending:
        return []
    return [checks.Warning(
        f"{len(pending)} migration(s) of django_leasequeue are not applied on database {alias!r}: "
        f"{', '.join(pending)}",
        hint="Run `manage.py migrate django_leasequeue` before starting workers.",
        id="leasequeue.W101",
    )]


@checks.register(checks.Tags.database)
def check_schedules(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn (``leasequeue.W102``) for each enabled schedule whose task is not registered.

    Every occurrence of such a schedule would be dead-lettered (only registered tasks run). The
    schedule table may not exist yet (before ``migrate``) and the database may be down: both
    report nothing. A warning, not an error: an error would stop ``migrate`` itself.
    """
    from django.db import DatabaseError, connections

    from . import registry
    from .exceptions import UnknownTask
    from .models import Schedule

    alias = _job_alias(databases)
    if alias is None:
        return []
    connection = connections[alias]
    try:
        # Look the table up first, so a missing table never aborts a caller's transaction.
        if Schedule._meta.db_table not in connection.introspection.table_names():
            return []
        rows = list(Schedule.objects.using(alias).filter(enabled=True).values_list("name", "task"))
    except DatabaseError:
        return []
    registry.autodiscover()
    messages: list[checks.CheckMessage] = []
    for name, task_name in rows:
        try:
            registry.get_task(task_name)
        except UnknownTask:
            hint = registry.did_you_mean(task_name)
            messages.append(checks.Warning(
                f"schedule {name!r} runs task {task_name!r}, which is not registered: every occurrence "
                "will be dead-lettered" + (f" ({hint})" if hint else ""),
                hint="Register the task with @task (in an installed app's tasks.py or jobs.py, or a module "
                     "listed in LEASEQUEUE['IMPORTS']), or disable the schedule.",
                obj=name, id="leasequeue.W102",
            ))
    return messages


@checks.register()
def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn (``leasequeue.W103``) about a metrics bearer token shorter than 16 characters."""
    from .conf import get_settings

    try:
        tokens = get_settings().metrics_tokens
    except ConfigurationError:
        return []  # reported by check_settings
    return [checks.Warning(
        f"a LEASEQUEUE['METRICS_TOKEN'] is only {len(t)} characters long",
        hint=f"Use a random token of at least {METRICS_TOKEN_MIN_LENGTH} characters, e.g. "
             "python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
        id="leasequeue.W103",
    ) for t in tokens if len(t) < METRICS_TOKEN_MIN_LENGTH]


@checks.register()
def check_schedule_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report an invalid ``LEASEQUEUE_SCHEDULES`` setting as ``leasequeue.E003`` (at deploy time,
    before a scheduler refuses to start)."""
    from .conf import get_settings
    from .scheduler import load_settings_schedules

    try:
        get_settings()
    except ConfigurationError:
        return []  # reported once, as leasequeue.E001
    try:
        load_settings_schedules()
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="leasequeue.E003")]
    except Exception as exc:  # validating task names imports the apps' task modules; they may fail
        return [checks.Error(f"importing the task modules failed: {exc!r}", id="leasequeue.E004",
                             hint="Workers import every installed app's tasks.py/jobs.py and LEASEQUEUE['IMPORTS'].")]
    return []


def require_migrated() -> None:
    """Raise ``CommandError`` naming the migrations to apply when the job table's database is not
    migrated, so ``runworker``, ``runscheduler`` and ``runreaper`` stop with one clear line instead
    of a traceback about a missing table or ``leasequeue_now()`` function.

    Raises:
        CommandError: migrations of django_leasequeue are not applied (or the database is down).
    """
    from django.core.management.base import CommandError
    from django.db import connections

    from .store import db_alias

    alias = db_alias()
    vendor = connections[alias].vendor
    if vendor != "postgresql":
        raise CommandError(f"django-leasequeue needs PostgreSQL; database {alias!r} is {vendor!r} "
                           "(set DATABASES[...]['ENGINE'] to 'django.db.backends.postgresql')")
    pending = pending_migrations(connections[alias])
    if pending is None:
        raise CommandError(f"cannot read the migration state of database {alias!r}: is PostgreSQL reachable?")
    if pending:
        raise CommandError(f"database {alias!r} lacks {len(pending)} migration(s) of django_leasequeue "
                           f"({', '.join(pending)}): run `manage.py migrate` first")
