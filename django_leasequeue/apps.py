"""Django AppConfig for django-leasequeue."""

from __future__ import annotations

from django.apps import AppConfig


class LeaseQueueConfig(AppConfig):
    """Registers the settings-change hook and the system checks."""

    name = "django_leasequeue"
    label = "django_leasequeue"
    verbose_name = "Lease queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import setting_changed

        from . import checks  # noqa: F401  (registers system checks)
        from .conf import _on_setting_changed

        setting_changed.connect(_on_setting_changed, dispatch_uid="leasequeue-settings")
