from django.apps import AppConfig


class FrameworkOnlyConfig(AppConfig):
    name = "tests.commands.fwonly"
    label = "fwonly"
