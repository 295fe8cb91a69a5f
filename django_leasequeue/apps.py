"""Django AppConfig for django-leasequeue."""

from __future__ import annotations

from django.apps import AppConfig


class LeaseQueueConfig(AppConfig):
    """Registers the settings-change hook and the system checks, and wires the schedules service
    into :class:`~django_leasequeue.models.Schedule`."""

    name = "django_leasequeue"
    label = "django_leasequeue"
    verbose_name = "Lease queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import (
            checks,  # noqa: F401  (registers system checks)
            schedules,
        )
        from .conf import _on_setting_changed
        from .models import install_schedule_service

        setting_changed.connect(_on_setting_changed, dispatch_uid="leasequeue-settings")
        install_schedule_service(schedules)
        self._load_tasks_framework()

    @staticmethod
    def _load_tasks_framework() -> None:
        """Import Django's tasks framework when ``TASKS`` uses our backend.

        The framework registers its system check (which calls each backend's ``check()``) only
        when it is imported, and nothing imports it before a task module is loaded: without this,
        ``manage.py check`` would never report a misconfigured LeaseQueueBackend on Django 6.
        """
        from django.conf import settings

        backends = getattr(settings, "TASKS", None) or {}
        if any(isinstance(cfg, dict) and str(cfg.get("BACKEND", "")).startswith("django_leasequeue.")
               for cfg in backends.values()):
            from . import compat_tasks  # noqa: F401
            from .backends.events import _install_attempt_hook

            # Once per process, before any worker thread runs a framework task.
            _install_attempt_hook()
