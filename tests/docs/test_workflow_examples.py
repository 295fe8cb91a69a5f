"""docs/howto/workflows.md, run as written: its python blocks are read from the page and executed
against the test database, and the jobs they build are run by ``drain()`` (the real claim,
executor and completer, in this thread), so the settle trigger releases each step as a worker's
completion would. The values the page shows (in the blocks' comments and in its prose) are the
exact values asserted here.

Each test runs the page's task definitions (the first block) in a fresh namespace, then the blocks
of one section. Where a section shows only prose (a dead step, a failing dependency), the test
mirrors it with a comment naming the section. A block that changes on the page is run as changed;
a value the page shows that stops matching the code fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from django_leasequeue import Workflow, store, task
from django_leasequeue.models import Job
from django_leasequeue.testing import drain

pytestmark = pytest.mark.django_db

PAGE = Path(__file__).resolve().parents[2] / "docs" / "howto" / "workflows.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
# The module name the page's tasks are registered under (``@task`` names a task after its module).
MODULE = "tests.docs.workflow_howto"
URL_HTML = "<html>https://example.com</html>"


def sections() -> dict[str, list[str]]:
    """The python blocks of the page by section heading (the text after ``## ``), in order;
    the blocks before the first section are under ``""``."""
    found: dict[str, list[str]] = {}
    for part in re.split(r"^## ", PAGE.read_text(), flags=re.MULTILINE):
        heading = part.split("\n", 1)[0].strip() if found else ""
        found[heading] = FENCE.findall(part)
    return found


def section(prefix: str) -> list[str]:
    """The python blocks of the one section whose heading starts with ``prefix``."""
    matches = [blocks for heading, blocks in sections().items() if heading.startswith(prefix)]
    assert len(matches) == 1, f"docs/howto/workflows.md has no single section starting {prefix!r}"
    assert matches[0], f"section {prefix!r} has no python block"
    return matches[0]


def run(block: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Execute one block of the page in ``namespace`` (the page's names stay defined)."""
    exec(compile(block, str(PAGE), "exec"), namespace)  # noqa: S102 - the page's own code
    return namespace


def page_tasks() -> dict[str, Any]:
    """A namespace holding the page's tasks (its first python block), registered under MODULE,
    and every name the page imports from django_leasequeue: a reader who reaches section 7 has
    imported ``chain`` in section 1."""
    first = sections()[""]
    assert first and "@task" in first[0], "the page's first python block should define its tasks"
    namespace = run(first[0], {"__name__": MODULE})
    imports = sorted(set(re.findall(r"^from django_leasequeue import .+$", PAGE.read_text(), re.MULTILINE)))
    return run("\n".join(imports), namespace)


def shown(block: str, expression: str) -> str:
    """The comment the page writes after ``expression`` in ``block`` (what it says the value is)."""
    for line in block.splitlines():
        code, _, comment = line.partition("#")
        if code.strip() == expression:
            return comment.strip()
    raise AssertionError(f"the block does not show {expression!r}:\n{block}")


def literal(comment: str, text: str) -> Any:
    """``text`` as a Python value, after checking that the page's comment starts with it."""
    assert comment.startswith(text), f"the page now shows {comment!r}, not {text!r}"
    return ast.literal_eval(text)


def test_chain_passes_each_result_to_the_next_step():
    build, inspect = section("1. Chain")
    ns = run(build, page_tasks())
    handle = ns["handle"]
    assert handle.state == literal(shown(inspect, "handle.state"), '"running"')
    assert [job.status for job in handle.steps().values()] == ["ready", "waiting", "waiting"]

    assert drain().done == 3

    assert handle.results() == literal(shown(inspect, "handle.results()"),
                                       f"[{URL_HTML!r}, 32, 'example: 32']")
    assert handle.state == "succeeded"
    assert list(handle.steps()) == ["1", "2", "3"]
    step_2 = handle.steps()["2"]
    assert (step_2.task, step_2.args, step_2.result) == (f"{MODULE}.parse", [URL_HTML], 32)
    assert handle.steps()["3"].args == [32]  # prepended; label="example" stays a keyword


def test_a_dead_chain_step_holds_the_rest_until_it_is_replayed():
    # Section "1. Chain", its prose: "When a step is dead-lettered, the rest of the chain waits"
    # ... "Replay it ... and the chain resumes from there. The steps that already ran do not run
    # again."
    ns = page_tasks()
    flag = {"fail": True}

    @task(name="tests.docs.wf.flaky", max_attempts=1)
    def flaky(size: int) -> int:
        if flag["fail"]:
            raise ValueError("upstream down")
        return size + 1

    handle = ns["chain"](ns["fetch"].step("https://example.com"), ns["parse"].step(), flaky.step(),
                         ns["store_size"].step(label="example")).enqueue()
    assert drain(raise_failures=False).outcomes == {"done": 2, "dead": 1}
    dead = handle.steps()["3"]
    assert dead.status == "dead"
    assert handle.steps()["4"].status == "waiting"
    assert handle.state == "blocked"
    assert [job.id for job in handle.blocked_by()] == [dead.id]

    flag["fail"] = False
    assert store.job_replay([dead.id]).replayed == [dead.id]
    result = drain()

    assert [r.job_id for r in result] == [dead.id, handle.steps()["4"].id]  # 1 and 2 not again
    assert handle.results() == [URL_HTML, 32, 33, "example: 33"]
    assert handle.state == "succeeded"


def test_cancel_cancels_the_rest_of_a_chain():
    # Section "1. Chain", its prose: "handle.cancel() cancels the rest: waiting and ready steps
    # are cancelled at once".
    build, _inspect = section("1. Chain")
    handle = run(build, page_tasks())["handle"]
    counts = handle.cancel(by="test")
    assert (counts.cancelled, counts.requested, counts.unchanged) == (3, 0, 0)
    assert [job.status for job in handle.steps().values()] == ["cancelled"] * 3
    assert len(drain()) == 0
    assert handle.state == "cancelled"


def test_group_counts_and_results_in_step_order():
    [block] = section("2. Group")
    ns = run(block, page_tasks())
    handle = ns["handle"]
    assert handle.counts() == literal(shown(block, "handle.counts()"),
                                      '{"waiting": 0, "ready": 100, "leased": 0, "done": 0, "dead": 0, "cancelled": 0}')
    assert handle.results() == [None] * 100  # "None for a member that is not done"

    assert drain().done == 100

    assert handle.results() == [i * 10 for i in range(100)]
    assert handle.counts()["done"] == 100
    assert handle.state == "succeeded"


def test_chord_callback_runs_once_with_every_result():
    [block] = section("3. Chord")
    handle = run(block, page_tasks())["handle"]
    callback = handle.callbacks()["on_success"]
    assert callback.status == "waiting"

    result = drain()

    assert result.done == 101
    assert [r.job_id for r in result].count(callback.id) == 1
    callback.refresh_from_db()
    assert (callback.status, callback.args[0], callback.result) == ("done", [i * 10 for i in range(100)], 49500)
    assert handle.state == "succeeded"


def test_batch_callbacks_wait_for_the_close():
    [block] = section("4. Batch")
    # The block up to its close(), then the close: the callbacks must wait for it.
    before_close, close_line = block.rsplit("batch.close()", 1)
    ns = run(before_close, page_tasks())
    batch = ns["batch"]
    assert drain().done == 4
    assert {role: job.status for role, job in batch.callbacks().items()} == {"on_success": "waiting",
                                                                            "on_complete": "waiting"}
    assert batch.state == "open"

    run("batch.close()" + close_line, ns)
    assert drain().done == 2

    callbacks = batch.callbacks()
    assert callbacks["on_success"].result == 100  # report([10, 20, 30, 40])
    assert callbacks["on_complete"].result == "nightly finished: 0"
    assert batch.results() == [10, 20, 30, 40]
    assert batch.state == "succeeded"
    assert type(batch).get(batch.id).id == batch.id  # "Batch.get(id) returns the handle"


def test_diamond_and_depends_on_existing_jobs():
    graph, single = section("5. Dependency graphs")
    ns = run(graph, page_tasks())
    handle = ns["handle"]
    assert drain().done == 4
    d = handle.steps()["d"]
    # "Here d receives {"b": 32, "c": 32} and returns 64."
    assert (d.args, d.result) == ([{"b": 32, "c": 32}], 64)
    assert handle.state == "succeeded"

    run(single, ns)
    first, later = ns["first"], ns["later"]
    assert (first.status, later.status, later.waiting_on) == ("ready", "waiting", 1)
    assert [r.job_id for r in drain()] == [first.id, later.id]
    later.refresh_from_db()
    assert (later.status, later.args, later.result) == ("done", ["<html/>"], 7)


def test_a_cycle_is_refused_and_nothing_is_written():
    # Section "5. Dependency graphs": "Cycles (`the workflow has a cycle: a -> b -> a`) ... are
    # refused when the workflow is built, and nothing is written."
    from django_leasequeue import EnqueueError

    ns = page_tasks()
    wf = Workflow("cycle")
    wf.add("a", ns["parse"].step("x"), depends_on=["b"])
    wf.add("b", ns["parse"].step("y"), depends_on=["a"])
    with pytest.raises(EnqueueError, match="the workflow has a cycle: (a -> b -> a|b -> a -> b)"):
        wf.enqueue()
    assert Job.objects.count() == 0


def test_a_step_that_runs_anyway_reads_the_failure_from_its_context(capsys):
    [block] = section("6. When a dependency dies")
    ns = run(block, page_tasks())

    # The section's cleanup task, given a dependency that dies (mirrors the section's table,
    # policy "run": "the step runs anyway").
    @task(name="tests.docs.wf.load", max_attempts=1)
    def load() -> int:
        raise ValueError("no data")

    wf = Workflow("nightly")
    wf.add("load", load.step())
    wf.add("cleanup", ns["cleanup"].step().set(on_dependency_dead="run"), depends_on=["load"])
    handle = wf.enqueue()

    assert drain(raise_failures=False).outcomes == {"dead": 1, "done": 1}

    assert capsys.readouterr().out == "load dead builtins.ValueError no data\n"
    assert handle.steps()["cleanup"].status == "done"
    assert handle.state == "finished"


def test_building_again_with_the_same_unique_key_writes_nothing():
    [block] = section("7. Idempotent building")
    ns = run(block, page_tasks())
    first = ns["handle"]
    assert first.created is True
    jobs = Job.objects.count()

    again = run(block, ns)["handle"]

    assert (again.created, again.id) == (False, first.id)
    assert Job.objects.count() == jobs == 2
