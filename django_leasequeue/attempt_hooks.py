"""Attempt hooks: middleware of the executor, told when an attempt starts and when its outcome is
recorded (the worker's tally, its Prometheus metrics, the tasks backend's events)."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from .context import JobContext

logger = logging.getLogger("django_leasequeue.executor")


class AttemptHook(Protocol):
    """A middleware of the executor: told when an attempt starts and when its outcome is recorded.

    Install one with :func:`install_attempt_hook`. Both methods run on the thread that started or
    ended the attempt; what a hook needs to carry from one to the other rides on the attempt's
    context (``ctx.attempt_data``). An exception a hook raises is logged, never propagated.
    """

    def attempt_started(self, ctx: JobContext) -> None:
        """Called before the handler of the attempt ``ctx`` runs."""

    def attempt_ended(self, ctx: JobContext, outcome: str) -> None:
        """Called once the attempt's outcome was recorded, right after its event was emitted.

        ``outcome`` is that event: ``succeeded``, ``retried``, ``snoozed``, ``dead_lettered``,
        ``cancelled`` or ``lease_lost``. A failure is reported from within the executor's
        ``except`` block, so ``sys.exc_info()`` shows the handler's exception.
        """


_HOOKS: list[AttemptHook] = []
_HOOKS_LOCK = threading.Lock()


def install_attempt_hook(hook: AttemptHook) -> None:
    """Add ``hook`` to the attempt hooks of every executor in this process (once: installing the
    same object again does nothing)."""
    with _HOOKS_LOCK:
        if hook not in _HOOKS:
            _HOOKS.append(hook)


def uninstall_attempt_hook(hook: AttemptHook) -> None:
    """Remove ``hook`` from the attempt hooks; nothing when it is not installed."""
    with _HOOKS_LOCK:
        if hook in _HOOKS:
            _HOOKS.remove(hook)


def attempt_started(ctx: JobContext) -> None:
    """Run every installed hook's ``attempt_started(ctx)``; never raises."""
    for hook in _HOOKS:
        try:
            hook.attempt_started(ctx)
        except Exception:
            logger.exception("attempt hook %r failed for job %s", hook, ctx.job_id)


def attempt_ended(ctx: JobContext, outcome: str) -> None:
    """Run every installed hook's ``attempt_ended(ctx, outcome)``; never raises."""
    for hook in _HOOKS:
        try:
            hook.attempt_ended(ctx, outcome)
        except Exception:
            logger.exception("attempt hook %r failed for job %s", hook, ctx.job_id)
