"""The test project's settings with no native task at all: only ``tests.commands.fwonly``'s 37
framework tasks (the apps with ``@django_leasequeue.task`` modules and the IMPORTS are left out)."""

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if app not in ("invoices", "qa", "flowlab")]  # noqa: F405
INSTALLED_APPS.append("tests.commands.fwonly")
LEASEQUEUE = {**LEASEQUEUE, "IMPORTS": []}  # noqa: F405
LEASEQUEUE_SCHEDULES: dict[str, object] = {}
TASKS = {"default": {"BACKEND": "django_leasequeue.backends.LeaseQueueBackend"}}
