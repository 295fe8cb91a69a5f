"""CHECK constraints on the job table's numeric, time and bookkeeping columns.

Why: the claim statement computes ``attempts + 1``, ``lease_version + 1``, ``now +
make_interval(secs => lease_seconds)`` and ``jsonb_array_length(errors)`` for every row it takes, and
the worker reads the times back into Python. One row written by hand or by an older version with a
value outside these ranges (``lease_seconds = 1e300``, ``attempts`` at the int maximum, a ``run_at``
of ``-infinity`` or past year 9999, ``errors`` that is not an array) would make every claim fail, for
every worker, until the row is fixed in SQL. Enqueue refuses such values before the INSERT; these
constraints make the database refuse them from every other writer too.

How, without locking a large table for long (the migration is not atomic: each step commits on
its own):

1. ``ADD CONSTRAINT ... NOT VALID``: a brief ACCESS EXCLUSIVE lock, no scan. From here on every
   INSERT and UPDATE is checked, so no new bad row can appear.
2. Existing rows that violate a constraint are repaired in place by one UPDATE (ordinary row
   locks; readers and the queue keep running). The repair keeps the job runnable and changes only
   the offending values, and says so in the job's history (an ``event: "repaired"`` entry naming
   the constraints):

   * ``lease_seconds`` outside (0, 7 days] or NaN: NULL, the worker's default lease;
   * ``max_attempts`` outside 1..1,000,000, ``attempts`` above 2,000,000 (1,999,999 for a ready
     job), ``snoozes`` above 2,000,000,000, ``concurrency_limit`` outside 1..1,000,000,
     ``lease_version`` above 2^62: clamped into the range;
   * a time outside 0001-01-02 .. 9999-12-30 UTC (infinities included): clamped into that range
     (a ``run_at`` of ``-infinity`` becomes due now, like any past run_at);
   * ``errors`` or ``history`` that is not a JSON array: wrapped in a one-element array.

   Arguments are not constrained (checking every number in them would cost a scan of every
   payload on each write); a claimed row whose arguments cannot be decoded is dead-lettered as
   ``CorruptRow`` by the worker instead, and the rest of its batch runs.
3. ``VALIDATE CONSTRAINT``: a scan under SHARE UPDATE EXCLUSIVE, which blocks neither reads nor
   writes.

The constraints are plain SQL (RunSQL), not ``Meta.constraints``: Django's ``AddConstraint`` cannot
add them ``NOT VALID``, and keeping them out of the model state means ``makemigrations`` sees no
change on any Django version. Reversing drops them (the repaired values stay).

The migration also records, in the model state only (no SQL), that the job's JSON columns decode
with :class:`~django_leasequeue.models.JobJSONDecoder`, so a row holding an integer past Python's
digit limit can still be read (the admin shows it; the worker dead-letters it as ``CorruptRow``).
"""

from django.db import migrations, models

import django_leasequeue.models

TABLE = "leasequeue_job"
LOW, HIGH = "'0001-01-02 00:00:00+00'::timestamptz", "'9999-12-30 23:59:59.999999+00'::timestamptz"


def _time(column: str, nullable: bool = True) -> str:
    check = f"({column} >= {LOW} AND {column} <= {HIGH})"
    return f"({column} IS NULL OR {check})" if nullable else check


def _clamp(column: str, low: str, high: str) -> str:
    return f"least(greatest({column}, {low}), {high})"


_TIMES = ("run_at", "created_at", "started_at", "attempted_at", "finished_at", "leased_until", "occurrence_at")

# name -> (check expression, {column: repaired value}). A repaired value equals the column's own
# value when the column is valid, so one UPDATE can apply every repair of a row at once: with the
# constraints added NOT VALID, an UPDATE that fixed one constraint but left another violated would
# itself be refused.
CONSTRAINTS: dict[str, tuple[str, dict[str, str]]] = {
    "leasequeue_job_lease_seconds_range": (
        "lease_seconds IS NULL OR (lease_seconds > 0 AND lease_seconds <= 604800)",
        {"lease_seconds": "CASE WHEN lease_seconds > 0 AND lease_seconds <= 604800 THEN lease_seconds END"},
    ),
    "leasequeue_job_max_attempts_range": (
        "max_attempts >= 1 AND max_attempts <= 1000000",
        {"max_attempts": _clamp("max_attempts", "1", "1000000")},
    ),
    # Far below the int maximum. A ready row stays one below the bound, so that the claim's
    # attempts + 1 can never be refused (which would fail the claim for every row of the batch);
    # the workers' own writes keep ready rows below max_attempts (<= 1,000,000) anyway.
    "leasequeue_job_attempts_range": (
        "attempts >= 0 AND attempts <= CASE WHEN status = 'ready' THEN 1999999 ELSE 2000000 END",
        {"attempts": _clamp("attempts", "0", "CASE WHEN status = 'ready' THEN 1999999 ELSE 2000000 END")},
    ),
    "leasequeue_job_snoozes_range": (
        "snoozes >= 0 AND snoozes <= 2000000000",
        {"snoozes": _clamp("snoozes", "0", "2000000000")},
    ),
    # 2^62: the claim and the reaper add 1 per cycle, so a token reaches the bound only from a
    # hand-written value within a few cycles of it; the bigint maximum stays 2^62 cycles away.
    "leasequeue_job_lease_version_range": (
        "lease_version >= 0 AND lease_version <= 4611686018427387904",
        {"lease_version": _clamp("lease_version", "0", "4611686018427387904")},
    ),
    "leasequeue_job_concurrency_limit_range": (
        "concurrency_limit IS NULL OR (concurrency_limit >= 1 AND concurrency_limit <= 1000000)",
        {"concurrency_limit": _clamp("concurrency_limit", "1", "1000000")},
    ),
    "leasequeue_job_times_range": (
        " AND ".join(_time(c, nullable=c not in ("run_at", "created_at")) for c in _TIMES),
        {c: _clamp(c, LOW, HIGH) for c in _TIMES},
    ),
    "leasequeue_job_errors_array": (
        "jsonb_typeof(errors) = 'array' AND jsonb_typeof(history) = 'array'",
        {"errors": "CASE WHEN jsonb_typeof(errors) = 'array' THEN errors ELSE jsonb_build_array(errors) END"},
    ),
}

_HISTORY = "CASE WHEN jsonb_typeof(history) = 'array' THEN history ELSE jsonb_build_array(history) END"


def repair_sql() -> str:
    """One UPDATE that repairs every row violating any constraint, and notes in the row's history
    (``{"event": "repaired", "constraints": [...]}``) which ones it repaired."""
    sets = [f"{column} = {value}" for _, fixes in CONSTRAINTS.values() for column, value in fixes.items()]
    names = ", ".join(f"CASE WHEN NOT ({check}) THEN '{name}' END" for name, (check, _) in CONSTRAINTS.items())
    sets.append(f"history = {_HISTORY} || jsonb_build_array(jsonb_build_object('event', 'repaired', "
                f"'constraints', to_jsonb(array_remove(ARRAY[{names}], NULL)), 'at', clock_timestamp()))")
    every = " AND ".join(f"({check})" for check, _ in CONSTRAINTS.values())
    return f"UPDATE {TABLE} SET {', '.join(sets)} WHERE NOT ({every})"


class Migration(migrations.Migration):

    # Each step commits on its own, so the ACCESS EXCLUSIVE lock of ADD CONSTRAINT is not held
    # through the repair and the validation scans.
    atomic = False

    dependencies = [
        ("django_leasequeue", "0003_admin_dashboard"),
    ]

    operations = [
        # State only (no SQL): the JSON columns read integers past Python's digit limit as Decimal.
        *[migrations.AlterField(model_name="job", name=name, field=models.JSONField(
            decoder=django_leasequeue.models.JobJSONDecoder, **options))
          for name, options in (("args", {"blank": True, "default": list}),
                                ("kwargs", {"blank": True, "default": dict}),
                                ("errors", {"blank": True, "default": list}),
                                ("history", {"blank": True, "default": list,
                                             "help_text": "operator events: replay, edit, cancel"}),
                                ("result", {"blank": True, "null": True}))],
        *[migrations.RunSQL(f"ALTER TABLE {TABLE} ADD CONSTRAINT {name} CHECK ({check}) NOT VALID",
                            reverse_sql=f"ALTER TABLE {TABLE} DROP CONSTRAINT IF EXISTS {name}")
          for name, (check, _) in CONSTRAINTS.items()],
        migrations.RunSQL(repair_sql(), reverse_sql=migrations.RunSQL.noop),
        *[migrations.RunSQL(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {name}", reverse_sql=migrations.RunSQL.noop)
          for name in CONSTRAINTS],
    ]
