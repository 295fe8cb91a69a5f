"""Django system checks: settings, database vendor."""

from __future__ import annotations

from typing import Any

from django.core import checks

from .exceptions import ConfigurationError


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


@checks.register(checks.Tags.database)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report a non-PostgreSQL database for the job table as ``leasequeue.E002``."""
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


@checks.register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report an invalid ``LEASEQUEUE_SCHEDULES`` setting as ``leasequeue.E003`` (at deploy time,
    before a scheduler refuses to start)."""
    from .scheduler import load_settings_schedules

    try:
        load_settings_schedules()
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="leasequeue.E003")]
    return []
