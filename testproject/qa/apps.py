from django.apps import AppConfig


class QaConfig(AppConfig):
    """Test-only tasks and the rows they write, so tests can count executions and effects."""

    name = "qa"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The process test of traces: a tracer provider when TESTPROJECT_TRACE_FILE names a file.
        from .otel import install_from_environment

        install_from_environment()
