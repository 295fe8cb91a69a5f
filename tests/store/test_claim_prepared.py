"""``PREPARED_CLAIMS``: the claim runs as ``EXECUTE`` of a statement prepared once per connection,
with a generic plan (planned once, not on every claim), in one round trip, its settings (JIT off,
generic plan) local to the claim's own implicit transaction. It leases exactly what the unprepared
claim leases, and a connection that lost the statement prepares it again without failing a claim."""

import pytest
from django.db import connection
from django.test import override_settings
from invoices.tasks import flaky_sync

from django_leasequeue import store
from django_leasequeue.conf import build
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Job
from django_leasequeue.store import PREPARED_CLAIM_SETTINGS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def prepared():
    with override_settings(LEASEQUEUE={"PREPARED_CLAIMS": True}):
        yield


@pytest.fixture
def sent():
    """The statements Django sends on ``connection`` while the test runs (one per round trip)."""
    statements: list[str] = []

    def wrapper(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield statements


def claim(limit=2):
    return store.job_claim(queues=["default"], limit=limit, worker_id="t:1:a", lease=30)


def statements_prepared():
    with connection.cursor() as cur:
        cur.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements")
        return cur.fetchall()


def session_settings():
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('jit'), current_setting('plan_cache_mode')")
        return cur.fetchone()


def test_prepared_claims_lease_like_the_plain_claim_with_one_round_trip_and_a_generic_plan(prepared, sent):
    connection.close()
    jobs = [flaky_sync.enqueue(f"k{i}", failures=0) for i in range(3)]
    before = session_settings()
    sent.clear()
    first = claim()
    assert [(j.id, j.attempts, j.lease_version, j.args) for j in first] == \
        [(jobs[0].id, 1, 1, ["k0"]), (jobs[1].id, 1, 1, ["k1"])]
    assert len(sent) == 2 and sent[0].startswith("PREPARE leasequeue_claim_")  # once per connection
    assert sent[1].startswith(f"{PREPARED_CLAIM_SETTINGS}; EXECUTE leasequeue_claim_")
    sent.clear()
    second = claim()
    assert [(j.id, j.lease_version) for j in second] == [(jobs[2].id, 1)]
    assert len(sent) == 1 and sent[0].startswith(f"{PREPARED_CLAIM_SETTINGS}; EXECUTE ")
    assert claim() == []
    assert {j.id: (j.status, j.lease_version, j.leased_by) for j in Job.objects.all()} == \
        {j.id: ("leased", 1, "t:1:a") for j in jobs}
    ((name, generic, custom),) = statements_prepared()
    assert name.startswith("leasequeue_claim_") and (generic, custom) == (3, 0)
    assert session_settings() == before == ("on", "auto")  # nothing outlives the claim's transaction


def test_a_connection_that_lost_the_statement_prepares_it_again_without_failing_a_claim(prepared, sent):
    assert claim() == []  # prepares it on this connection
    job = flaky_sync.enqueue("k", failures=0)
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # as DISCARD ALL (a pooler's reset) does
    sent.clear()
    (again,) = claim()
    assert again.id == job.id
    assert [s.split(" ")[0] for s in sent] == ["SET", "PREPARE", "SET"]  # refused, prepared, claimed
    assert len(statements_prepared()) == 1
    connection.close()  # a new connection prepares it again
    assert claim() == [] and len(statements_prepared()) == 1


def test_prepared_claims_must_be_a_bool():
    assert build({"PREPARED_CLAIMS": True}).prepared_claims is True
    assert build({}).prepared_claims is False
    with pytest.raises(ConfigurationError, match=r"LEASEQUEUE\['PREPARED_CLAIMS'\] must be True or False, got 'yes'"):
        build({"PREPARED_CLAIMS": "yes"})


def test_server_side_binding_claims_unprepared(prepared, sent, monkeypatch):
    """Server-side binding takes one statement per message: the claim then runs as without
    PREPARED_CLAIMS (its JIT switch in a short transaction of its own), and prepares nothing."""
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {**connection.settings_dict.get("OPTIONS", {}),
                                                               "server_side_binding": True})
    connection.close()
    job = flaky_sync.enqueue("k", failures=0)
    sent.clear()
    assert [j.id for j in claim()] == [job.id]
    assert not any(s.startswith(("PREPARE", "EXECUTE")) or "EXECUTE leasequeue_claim_" in s for s in sent), sent
    assert statements_prepared() == []
