"""Self-test of the execution ledger's arithmetic (``harness.analyse_runs``) on synthetic rows: a
check that cannot fail measures nothing, so each count is shown to catch the case it names, and to
stay 0 on a clean history. Pure Python: no database, no worker; marked ``chaos`` as part of the
chaos suite, whose books it checks."""

from datetime import UTC, datetime, timedelta

import pytest

from tests.support.chaos.harness import Run, analyse_runs

pytestmark = pytest.mark.chaos

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(job: int, token: int, start: float, end: float | None, outcome: str = "returned", *, pid: int = 1,
        key: str = "") -> Run:
    return Run(job_id=job, token=token, pid=pid, started=at(start), ended=None if end is None else at(end),
               outcome=outcome if end is not None else "", concurrency_key=key, worker=f"w{pid}")


def dead(pid: int) -> bool:
    return False


def test_a_clean_history_counts_nothing():
    runs = [run(1, 1, 0, 1), run(2, 1, 0, 2, "raised"), run(2, 2, 3, 4)]  # job 2: the first attempt raised
    books = analyse_runs(runs, alive=dead)
    assert (books.executions, books.returned, books.reruns, books.overlaps) == (3, 2, 0, 0)
    assert books.max_per_key == {}


def test_a_start_after_a_recorded_return_is_a_rerun():
    # Job 7 returned under token 1, then ran again under tokens 2 and 3 (after the reaper took it
    # back twice); job 8 raised under token 1 and its retry is no re-run.
    runs = [run(7, 1, 0, 1), run(7, 2, 5, 6), run(7, 3, 9, 9.5), run(8, 1, 0, 1, "raised"), run(8, 2, 2, 3)]
    books = analyse_runs(runs, alive=dead)
    assert (books.reruns, books.rerun_jobs, books.overlaps) == (2, 1, 0)
    assert "job 7 returned under token 1" in books.examples[0]


def test_the_retry_of_a_timed_out_attempt_is_no_rerun():
    # Job 9's handler returned after its task's timeout: the worker discards the value and records
    # a JobTimedOut failure, so its retry under token 2 re-runs no returned job. Job 10 returned in
    # time under token 1 and ran again: a re-run.
    runs = [run(9, 1, 0, 6, "timed_out"), run(9, 2, 7, 8), run(10, 1, 0, 1), run(10, 2, 2, 3)]
    books = analyse_runs(runs, alive=dead)
    assert (books.executions, books.returned, books.reruns, books.rerun_jobs) == (4, 3, 1, 1)


def test_intervals_that_intersect_overlap_and_touching_ones_do_not():
    runs = [run(1, 1, 0, 5, "raised"), run(1, 2, 4, 6),  # overlap: [0,5) and [4,6)
            run(2, 1, 0, 2, "raised"), run(2, 2, 2, 3)]  # touching: no overlap
    books = analyse_runs(runs, alive=dead)
    assert (books.overlaps, books.overlapping_jobs, books.reruns) == (1, 1, 0)


def test_an_execution_that_never_returned_ends_at_its_process_death_or_is_still_running():
    # pid 1 was SIGKILLed at 3 s: its unfinished run of job 1 ended then; the retry at 4 s does not
    # overlap. pid 2 is still alive: its unfinished run of job 2 overlaps the retry on pid 3.
    runs = [run(1, 1, 0, None, pid=1), run(1, 2, 4, 5, pid=3),
            run(2, 1, 0, None, pid=2), run(2, 2, 4, 5, pid=3)]
    books = analyse_runs(runs, deaths={1: at(3)}, alive=lambda pid: pid == 2, now=at(10))
    assert (books.overlaps, books.overlapping_jobs, books.open_ended, books.unknown_end) == (1, 1, 1, 0)
    # A death recorded after the retry started (a frozen process) is an overlap.
    books = analyse_runs(runs[:2], deaths={1: at(4.5)}, alive=dead)
    assert books.overlaps == 1
    # A process gone at an unknown time cannot be shown to overlap: it is counted apart.
    books = analyse_runs(runs[:2], alive=dead)
    assert (books.overlaps, books.unknown_end) == (0, 1)


def test_most_handlers_of_one_key_at_once():
    runs = [run(1, 1, 0, 10, "raised", key="k"), run(2, 1, 2, 3, key="k"), run(3, 1, 2.5, 4, key="k"),
            run(4, 1, 4, 5, key="k"),  # starts as 3 ends: 2 at once there, not 3
            run(5, 1, 0, 1, key="other")]
    books = analyse_runs(runs, alive=dead)
    assert books.max_per_key == {"k": 3, "other": 1}
    assert books.max_concurrent_per_key == 3


def test_most_handlers_at_once_in_one_process():
    # pid 1 (say --concurrency 2) runs a handler past its timeout while two more start: 3 at once.
    runs = [run(1, 1, 0, 10, pid=1), run(2, 1, 1, 3, pid=1), run(3, 1, 2, 4, pid=1), run(4, 1, 0, 1, pid=2)]
    books = analyse_runs(runs, alive=dead)
    assert books.max_per_process == {1: 3, 2: 1}
