from django.apps import AppConfig


class QaConfig(AppConfig):
    """Test-only tasks and the rows they write, so tests can count executions and effects."""

    name = "qa"
    default_auto_field = "django.db.models.BigAutoField"
