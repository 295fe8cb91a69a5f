from django.apps import AppConfig


class FlowlabConfig(AppConfig):
    """Tasks and probe rows for the flow-control tests and demos."""

    name = "flowlab"
    default_auto_field = "django.db.models.BigAutoField"
