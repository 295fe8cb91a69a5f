"""Chaos: poison rows written by hand with raw SQL (as an older version, a manual fix or another
program could), among normal jobs of both workloads and a few innocent ``max_attempts=1`` jobs:

* a job whose ``args`` holds a 5,000-digit integer: jsonb stores it, but Python refuses to decode
  an integer of more than 4,300 digits;
* a job with ``lease_seconds = 1e300``: no interval can hold that lease.

The rows are copies of a normal ready job with one column changed, inserted with SQL so that no
enqueue validation sees them. Once the job table has a CHECK constraint on ``lease_seconds``, the
database refuses the second row: then the test asserts that the INSERT is refused and nothing is
written, instead of its dead letter (the test reads ``pg_constraint`` to know which case holds).

No handler is killed or frozen: nothing lost, no returned job runs again, no two attempts of one
job at once; every innocent job runs and ends done; each poison row that was written ends
finished (dead-lettered with a reason), never leased or ready for good.
"""

import pytest
from django.db import DatabaseError, connection, transaction

from django_leasequeue.models import Job
from tests.support.chaos.harness import (
    Fleet,
    assert_balanced,
    assert_no_overlaps,
    assert_no_reruns,
    enqueue_both,
    enqueue_plain,
    ledger,
    record,
    runs_note,
    scaled,
    statuses,
    wait_settled,
)

pytestmark = [pytest.mark.chaos, pytest.mark.process]

JOBS = scaled(400)  # both workloads together
INNOCENT_ONE_SHOT = 6  # plain jobs with max_attempts=1: a lost claim would dead-letter them unrun

# column -> SQL expression replacing it in the copy of a normal row
POISON = {
    "bigint_args": ("args", "('[' || repeat('9', 5000) || ']')::jsonb"),
    "huge_lease": ("lease_seconds", "1e300::float8"),
}


def check_constraint_on(column: str) -> bool:
    """Whether the job table has a CHECK constraint naming ``column`` (a later migration adds
    them; then the database itself refuses the poison value)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE conrelid = 'leasequeue_job'::regclass AND contype = 'c'")
        return any(column in definition for (definition,) in cur.fetchall())


def insert_copy(template: int, column: str, expression: str) -> int | None:
    """Insert a copy of job ``template`` with ``column`` set to ``expression``, by raw SQL; return
    the new id, or None if the database refused the row."""
    with connection.cursor() as cur:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'leasequeue_job' "
                    "AND column_name <> 'id' ORDER BY ordinal_position")
        columns = [c for (c,) in cur.fetchall()]
    values = [expression if c == column else c for c in columns]
    sql = (f"INSERT INTO leasequeue_job ({', '.join(columns)}) SELECT {', '.join(values)} "
           "FROM leasequeue_job WHERE id = %s RETURNING id")
    try:
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, [template])
            return cur.fetchone()[0]
    except DatabaseError:
        return None


def test_poison_rows_written_by_hand(spawn):
    fenced, plain = enqueue_both(JOBS // 2, seed=31)
    one_shot = enqueue_plain(INNOCENT_ONE_SHOT, seed=32, max_attempts=1, long_share=0, short_share=0)
    ids = fenced + plain + one_shot
    template = one_shot[0]
    before = Job.objects.count()
    poison: dict[str, int] = {}
    refused: list[str] = []
    for name, (column, expression) in POISON.items():
        constrained = check_constraint_on(column)
        new = insert_copy(template, column, expression)
        if constrained:
            # The constraint exists: the database must refuse the row, and nothing is written.
            assert new is None, f"{name}: the CHECK constraint on {column} let the row in"
            refused.append(name)
        else:
            assert new is not None, f"{name}: refused without a CHECK constraint on {column}"
            poison[name] = new
    assert Job.objects.count() == before + len(poison)

    fleet = Fleet(spawn, concurrency=4)
    fleet.start_reaper()
    fleet.start()
    fleet.start()
    fleet.wait_registered()
    drained = wait_settled(90)
    alive = [m.name for m in fleet.live()]
    exits = fleet.stop()
    books = ledger(ids, deaths=fleet.deaths)
    rows = {name: Job.objects.values("status", "attempts", "errors").get(pk=pk) for name, pk in poison.items()}
    outcome = {name: (r["status"], [e.get("type") for e in r["errors"]]) for name, r in rows.items()}
    one_shot_statuses = statuses(one_shot)
    record("poison_rows", fault="rows written by hand: a 5,000-digit integer in args, lease_seconds = 1e300, "
           "among both workloads and 6 innocent max_attempts=1 jobs (2 workers)", jobs=len(ids) + len(poison),
           faults=len(POISON), books=books, recovery=None,
           recovery_meaning="no recovery time: a poison row must harm only itself",
           notes=f"poison rows {outcome or 'none written'}; refused by a CHECK constraint: {refused or 'none'}; "
                 f"innocent max_attempts=1 jobs {one_shot_statuses}; {runs_note(books)}",
           also=list(poison.values()), poison=outcome, refused=refused)

    assert drained is not None, f"not drained after 90 s: {statuses(ids)}; poison {outcome}; {runs_note(books)}"
    assert len(alive) == 2
    assert_balanced(books, done=len(ids))
    assert one_shot_statuses == {"done": INNOCENT_ONE_SHOT}
    assert_no_reruns(books)
    assert_no_overlaps(books)
    for name, (status, _) in outcome.items():
        assert status == "dead", (name, rows[name])
    assert all(code == 0 for code, _ in exits.values()), exits
