"""The store package's shape: every name callers use is importable from ``django_leasequeue.store``,
each module stays small, every claim variant returns the columns the decoder reads by name, and the
decoder does not depend on the order of those columns."""

from __future__ import annotations

import ast
import random
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from django_leasequeue import store
from django_leasequeue.store import claim, flow, keys, testing

STORE = Path(store.__file__).resolve().parent
# The names callers, tests, docs and benchmarks use through the package (a sample across modules).
USED_NAMES = ["db_now", "db_alias", "CLOCK", "JOB_TABLE", "TOKEN_MAX", "NewJob", "job_insert", "job_insert_one",
              "job_insert_many", "job_get_by_unique_key", "ClaimedJob", "ClaimResult", "job_claim", "JOB_CLAIM",
              "JOB_CLAIM_ANY_QUEUE", "RATE_LOCK", "JOB_CLAIM_RATED", "JOB_CLAIM_ANY_QUEUE_RATED", "job_renew",
              "job_complete", "job_fail", "job_snooze", "job_release", "job_lock_fenced", "job_lock_for_commit",
              "job_note_lease_lost", "job_set_result", "JOB_RENEW", "JOB_REAP", "JOB_PRUNE", "job_reap_expired",
              "process_register", "job_request_cancel", "job_replay", "job_retry_now", "queue_pause",
              "queue_resume", "queue_list", "flow_metrics", "schedule_lock_due", "schedule_sync_settings",
              "job_get", "job_claim_ids", "job_expire_lease", "clock_offset_set", "clock_real_now"]


def test_every_public_name_of_the_modules_is_exported_by_the_package():
    exported = set(store.__all__)
    for path in sorted(STORE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        public = {name for name in defined if not name.startswith("_")} - {"logger"}
        assert public <= exported, f"{path.name}: not exported by store/__init__.py: {sorted(public - exported)}"
    assert set(USED_NAMES) <= exported
    assert all(hasattr(store, name) for name in store.__all__)


def test_each_module_stays_under_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in STORE.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 600} == {}


CLAIM_COLUMNS = ["id", "task", "queue", "args", "kwargs", "attempts", "max_attempts", "lease_version",
                 "leased_until_us", "lease_seconds", "claimed_at_us", "priority", "created_at_us", "started_at_us",
                 "error_count", "run_at_us", "trace_context"]


@pytest.mark.parametrize("sql", [claim.JOB_CLAIM, claim.JOB_CLAIM_ANY_QUEUE, flow.JOB_CLAIM_RATED,
                                 flow.JOB_CLAIM_ANY_QUEUE_RATED, testing.JOB_CLAIM_IDS, keys.JOB_CLAIM_FAIR],
                         ids=["claim", "any-queue", "rated", "any-queue-rated", "ids", "fair"])
def test_every_claim_variant_names_the_columns_the_decoder_reads(sql):
    returned = sql[sql.rindex("SELECT c.id"):] if "SELECT c.id" in sql else sql[sql.rindex("RETURNING"):]
    missing = [c for c in CLAIM_COLUMNS if not re.search(rf"(\bAS |\b[jc]\.){c}\b", returned)]
    assert missing == []


def test_the_decoder_reads_columns_by_name_whatever_their_order():
    values = {"id": 7, "task": "t", "queue": "q", "args": "[1]", "kwargs": '{"a": 2}', "attempts": 1,
              "max_attempts": 3, "lease_version": 4, "leased_until_us": 1_700_000_030_000_000, "lease_seconds": 30,
              "claimed_at_us": 1_700_000_000_000_000, "priority": 5, "created_at_us": 1_699_999_000_000_000,
              "started_at_us": None, "error_count": 0, "run_at_us": 1_699_999_000_000_000,
              "trace_context": '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'}
    names = tuple(values)
    shuffled_list = list(names)
    random.Random(14).shuffle(shuffled_list)
    shuffled = tuple(shuffled_list)
    assert shuffled != names
    first = claim._claim_decoder(names)(tuple(values[n] for n in names))
    second = claim._claim_decoder(shuffled)(tuple(values[n] for n in shuffled))
    assert first == second == store.ClaimedJob(
        id=7, task="t", queue="q", args=[1], kwargs={"a": 2}, attempts=1, max_attempts=3, lease_version=4,
        leased_until=datetime(2023, 11, 14, 22, 13, 50, tzinfo=UTC), lease_seconds=30.0,
        claimed_at=datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC), priority=5,
        created_at=datetime(2023, 11, 14, 21, 56, 40, tzinfo=UTC), started_at=None, error_count=0,
        run_at=datetime(2023, 11, 14, 21, 56, 40, tzinfo=UTC),
        trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})


def _squash(sql: str) -> str:
    return " ".join(sql.split())


@pytest.mark.parametrize("sql", [claim.JOB_CLAIM_ANY_QUEUE, flow.JOB_CLAIM_RATED, flow.JOB_CLAIM_ANY_QUEUE_RATED,
                                 testing.JOB_CLAIM_IDS, keys.JOB_CLAIM_FAIR],
                         ids=["any-queue", "rated", "any-queue-rated", "ids", "fair"])
def test_the_claim_variants_spell_the_shared_rules_alike(sql):
    """Each variant is written out in full; the rules they share must stay word for word the same as
    in the plain claim: the task filter, the token room, the sequence rule, the concurrency and
    rate-key admissions, the lease SET and the returned columns (the testing helpers' claim of
    chosen ids has no task filter)."""
    plain = _squash(claim.JOB_CLAIM)
    admission = re.search(r"AND j\.lease_version < \d+ AND CASE WHEN \(j\.sequence_key IS NULL .*? "
                          r"THEN \(j\.concurrency_key IS NULL .*?%\(claim\)s\)\)\)"
                          r" AND \(j\.rate_key IS NULL .*?%\(claim\)s, j\.id\)\)\) ELSE false END", plain)
    lease_set = re.search(r"SET status = 'leased', .*? attempted_at = clock\.now", plain)
    returning = re.search(r"RETURNING (j\.id, .*? AS run_at_us, left\(j\.trace_context::text, \d+\) AS trace_context)",
                          plain)
    assert admission and lease_set and returning
    assert admission.group(0) in _squash(sql)
    assert lease_set.group(0) in _squash(sql)
    assert returning.group(1) in _squash(sql)
    tasks = "AND (%(all_tasks)s OR j.task = ANY(%(tasks)s::text[]))"
    assert tasks in plain and (tasks in sql) == (sql is not testing.JOB_CLAIM_IDS)


def test_the_two_rated_claims_share_their_rate_bookkeeping_word_for_word():
    """The rate-limited claims differ only in how they pick candidates; the queues' allowance (``q``)
    and everything from the lease on (``claimed``, ``counts``, ``logged``, ``waits`` and the final
    SELECT) is the same text in both, so a fix to the rate log cannot reach one and miss the other."""
    def parts(sql: str) -> tuple[str, str]:
        text = _squash(sql)
        allowance = re.search(r"q AS MATERIALIZED \(.*?\), (?:picked|unrated) AS", text)
        tail = text[text.index("claimed AS ("):]
        assert allowance is not None
        return allowance.group(0).rsplit("),", 1)[0], tail

    assert parts(flow.JOB_CLAIM_RATED) == parts(flow.JOB_CLAIM_ANY_QUEUE_RATED)
