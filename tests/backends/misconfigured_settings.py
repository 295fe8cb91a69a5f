"""The test project's settings with a misconfigured LeaseQueueBackend (for ``manage.py check``)."""

from testproject.settings import *  # noqa: F403

TASKS = {"default": {"BACKEND": "django_leasequeue.backends.LeaseQueueBackend", "OPTIONS": {"MAX_ATTEMPS": 3}}}
