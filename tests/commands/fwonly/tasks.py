"""37 framework tasks, ``step_01`` .. ``step_37``, and no native one.

Built in a loop so that the count is one number; each is a module-level function under its own
name, as the framework requires (its ``module_path`` is ``tests.commands.fwonly.tasks.step_NN``).
"""

from typing import Any

from django_leasequeue.compat_tasks import task

COUNT = 37


def _step(number: int) -> Any:
    def run(value: int) -> int:
        return value * number

    run.__name__ = run.__qualname__ = f"step_{number:02d}"
    run.__module__ = __name__
    return task(run)


for _number in range(1, COUNT + 1):
    globals()[f"step_{_number:02d}"] = _step(_number)
