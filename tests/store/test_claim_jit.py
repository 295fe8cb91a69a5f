"""The claim runs with JIT compilation off for its own statement: on a large backlog its cost
estimate crosses ``jit_above_cost`` and compiling costs about a hundred times the claim. The
switch is ``SET LOCAL`` in the claim's own (implicit) transaction, so no session state is left
on the connection, which behind PgBouncer in transaction mode the next client would inherit."""

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_leasequeue import store
from django_leasequeue.store import JIT_OFF_LOCAL

pytestmark = pytest.mark.django_db(transaction=True)


def jit() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        return cur.fetchone()[0]


def claim() -> None:
    store.job_claim(queues=["default"], limit=1, worker_id="t:1:a", lease=30)


@pytest.fixture
def sent():
    """The statements Django sends on ``connection`` while the test runs (one per round trip)."""
    statements: list[str] = []

    def wrapper(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield statements


def test_a_claim_leaves_the_sessions_jit_setting_as_it_was():
    for setting in ("on", "off", "on"):
        with connection.cursor() as cur:
            cur.execute(f"SET jit = {setting}")
        claim()
        claim()
        assert jit() == setting


def test_the_plain_claim_is_one_round_trip_with_jit_off_first(sent):
    """Unprepared (``PREPARED_STATEMENTS`` off); the prepared claim's message carries the same
    ``SET LOCAL`` (tests/store/test_claim_prepared.py)."""
    with override_settings(LEASEQUEUE={"PREPARED_STATEMENTS": False}):
        claim()
    claims = [s for s in sent if "leasequeue_job" in s]
    assert len(claims) == 1 and len(sent) == 1, sent
    assert claims[0].startswith(f"{JIT_OFF_LOCAL}; ")


def test_set_local_in_one_message_turns_jit_off_for_the_statements_after_it_only():
    """What the claim relies on: the statements of one simple query are one implicit transaction,
    so a ``SET LOCAL`` at its head holds for the planning of the next statement and ends with it.
    With every JIT threshold at 0, ``EXPLAIN ANALYZE`` reports JIT for a plain statement and none
    after the ``SET LOCAL``."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_jit_available()")
        if not cur.fetchone()[0]:
            pytest.skip("this PostgreSQL has no JIT provider")
        cur.execute("SET jit = on; SET jit_above_cost = 0")
        query = "EXPLAIN (ANALYZE, FORMAT JSON) SELECT sum(g) FROM generate_series(1, 10) g"
        cur.execute(query)
        assert "JIT" in cur.fetchone()[0][0]
        cur.execute(f"{JIT_OFF_LOCAL}; {query}")
        cur.nextset()
        assert "JIT" not in cur.fetchone()[0][0]
        cur.execute("SHOW jit")
        assert cur.fetchone()[0] == "on"
        cur.execute("RESET jit_above_cost")


def test_a_claim_inside_a_callers_transaction_leaves_its_settings_alone(sent):
    connection.close()
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET LOCAL jit = on")
        claim()
        assert jit() == "on"
    assert not any(JIT_OFF_LOCAL in s for s in sent), sent


def test_a_rate_limited_claim_sets_jit_off_in_its_transaction_only(sent, settings):
    settings.LEASEQUEUE = {**settings.LEASEQUEUE, "QUEUES": {"default": {"rate_limit": "10/s"}, "invoices": {}}}
    with connection.cursor() as cur:
        cur.execute("SET jit = on")
    claim()
    assert JIT_OFF_LOCAL in sent, sent
    assert jit() == "on"


def test_with_server_side_binding_the_claim_takes_a_transaction_of_its_own(sent):
    """Server-side binding sends one statement per message: the switch and the claim then run in a
    short transaction, and the session is still left as it was."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    connection.close()
    options["server_side_binding"] = True
    try:
        with connection.cursor() as cur:
            cur.execute("SET jit = on")
        claim()
        assert jit() == "on"
        claims = [s for s in sent if "leasequeue_job" in s]
        assert len(claims) == 1 and not claims[0].startswith(JIT_OFF_LOCAL)
        assert sent[sent.index(claims[0]) - 1] == JIT_OFF_LOCAL
    finally:
        del options["server_side_binding"]
        connection.close()
