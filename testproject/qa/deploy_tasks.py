"""A task only the newer worker of a rolling deploy knows (``LEASEQUEUE_EXTRA_TASKS=1`` adds this
module to ``LEASEQUEUE["IMPORTS"]``). Tests import it themselves to enqueue by name."""

from django_leasequeue import JobContext, task

from .tasks import _record


@task(name="qa.new_task", takes_context=True, max_attempts=3)
def new_task(context: JobContext, tag: str = "") -> str:
    """Count one execution (with the worker's id), as ``qa.record`` does."""
    _record(context, tag)
    return tag
