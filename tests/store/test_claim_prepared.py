"""``PREPARED_STATEMENTS`` (on by default): the claim runs as ``EXECUTE`` of a statement prepared
once per server connection, with a generic plan (planned once, not on every claim), in one round
trip, its settings (JIT off, generic plan) local to the claim's own implicit transaction. It leases
exactly what the unprepared claim leases. A server connection that lacks the statement, that has it
already, or whose statement's result type changed under it costs one more message, never a
failed claim (store/_prepared.py)."""

import re

import psycopg
import pytest
from django.db import DatabaseError, NotSupportedError, connection, transaction
from django.test import override_settings
from invoices.tasks import flaky_sync

from django_leasequeue import store
from django_leasequeue.conf import build
from django_leasequeue.exceptions import ConfigurationError
from django_leasequeue.models import Job
from django_leasequeue.store import PREPARED_CLAIM_SETTINGS, _prepared

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent():
    """The statements Django sends on ``connection`` while the test runs (one per round trip)."""
    statements: list[str] = []

    def wrapper(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield statements


@pytest.fixture
def sent_with_params():
    """``(statement, parameters)`` of each message Django sends on ``connection`` in the test."""
    messages: list[tuple[str, object]] = []

    def wrapper(execute, sql, params, many, context):
        messages.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield messages


def claim(limit=2):
    return store.job_claim(queues=["default"], limit=limit, worker_id="t:1:a", lease=30)


def statements_prepared():
    with connection.cursor() as cur:
        cur.execute("SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE '%%UPDATE%%' ORDER BY name")
        return cur.fetchall()


def session_settings():
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('jit'), current_setting('plan_cache_mode')")
        return cur.fetchone()


def kinds(statements):
    """The first word of each statement sent, and whether it executes a prepared claim."""
    return [(s.split(" ")[0], "EXECUTE leasequeue_" in s) for s in statements]


def test_claims_are_prepared_by_default_lease_like_the_plain_claim_in_one_round_trip(sent):
    connection.close()
    jobs = [flaky_sync.enqueue(f"k{i}", failures=0) for i in range(3)]
    before = session_settings()
    sent.clear()
    first = claim()
    assert [(j.id, j.attempts, j.lease_version, j.args) for j in first] == \
        [(jobs[0].id, 1, 1, ["k0"]), (jobs[1].id, 1, 1, ["k1"])]
    # One message the first time on a connection: PREPARE, the settings, EXECUTE.
    assert len(sent) == 1 and sent[0].startswith("PREPARE leasequeue_")
    assert f"; {PREPARED_CLAIM_SETTINGS}; EXECUTE leasequeue_" in sent[0]
    sent.clear()
    second = claim()
    assert [(j.id, j.lease_version) for j in second] == [(jobs[2].id, 1)]
    assert len(sent) == 1 and sent[0].startswith(f"{PREPARED_CLAIM_SETTINGS}; EXECUTE leasequeue_")
    assert claim() == []
    assert {j.id: (j.status, j.lease_version, j.leased_by) for j in Job.objects.all()} == \
        {j.id: ("leased", 1, "t:1:a") for j in jobs}
    ((name, generic, custom),) = statements_prepared()
    assert name.startswith("leasequeue_") and (generic, custom) == (3, 0)
    assert session_settings() == before == ("on", "auto")  # nothing outlives the claim's transaction


def test_a_server_connection_that_lost_the_statement_prepares_it_in_the_claims_message(sent):
    assert claim() == []  # prepares it on this connection
    job = flaky_sync.enqueue("k", failures=0)
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # as DISCARD ALL (a pooler's reset) or another server connection
    sent.clear()
    (again,) = claim()
    assert (again.id, again.lease_version) == (job.id, 1)
    assert kinds(sent) == [("SET", True), ("PREPARE", True)]  # refused, then prepared and claimed
    assert len(statements_prepared()) == 1
    connection.close()  # a new connection prepares it again
    assert claim() == [] and len(statements_prepared()) == 1


def test_a_server_connection_that_has_the_statement_already_runs_it_without_preparing(sent):
    """Behind a pooler another client may have prepared it on this server connection: the PREPARE
    is refused (42P05) before anything ran, and the EXECUTE alone follows."""
    assert claim() == []
    job = flaky_sync.enqueue("k", failures=0)
    _prepared._known[connection.connection].clear()  # this client does not know it is there
    sent.clear()
    (again,) = claim()
    assert (again.id, again.lease_version, again.attempts) == (job.id, 1, 1)
    assert kinds(sent) == [("PREPARE", True), ("SET", True)]
    assert Job.objects.get(pk=job.pk).lease_version == 1  # the refused message leased nothing


def test_a_statement_whose_result_type_changed_is_prepared_again(sent):
    """A migration that alters a returned column's type makes ``EXECUTE`` of the statement prepared
    before it fail ("cached plan must not change result type"): it is deallocated and prepared
    again in the same message."""
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE lq_prepared_probe (v varchar(10))")
        cur.execute("INSERT INTO lq_prepared_probe VALUES ('a')")
    try:
        sql = "SELECT v FROM lq_prepared_probe WHERE %(n)s::int = 1"
        assert _prepared.run_prepared(sql, {"n": 1}, alias="default")[0] == [("a",)]
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE lq_prepared_probe ALTER COLUMN v TYPE varchar(20)")
        sent.clear()
        assert _prepared.run_prepared(sql, {"n": 1}, alias="default")[0] == [("a",)]
        assert [s.split(" ")[0] for s in sent] == ["EXECUTE", "DEALLOCATE"]
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TABLE lq_prepared_probe")


def test_a_changed_result_type_is_recognised_by_its_sqlstate_in_any_language():
    """The server translates its messages (``lc_messages``): the refusal is told by SQLSTATE."""
    german = psycopg.errors.FeatureNotSupported("gecachter Plan darf den Ergebnistyp nicht ändern")
    try:
        raise DatabaseError("wrapped") from german
    except DatabaseError as exc:
        assert _prepared._refusal(exc) == "replace"
    try:
        raise DatabaseError("wrapped") from psycopg.errors.UniqueViolation("doppelter Schlüsselwert")
    except DatabaseError as exc:
        assert _prepared._refusal(exc) is None


def test_a_feature_not_supported_error_of_the_statement_itself_still_reaches_the_caller(sent):
    """Any other 0A000 (here PostgreSQL's refusal of FOR UPDATE with an aggregate) is sent at most
    ``MAX_SENDS`` times; then the caller runs the statement unprepared, which raises it."""
    sql = "SELECT count(*) FROM leasequeue_job WHERE %(n)s::int = 1 FOR UPDATE"
    sent.clear()
    assert _prepared.run_prepared(sql, {"n": 1}, alias="default") is None
    assert len(sent) == _prepared.MAX_SENDS
    with pytest.raises(NotSupportedError), connection.cursor() as cur:
        cur.execute(sql, {"n": 1})


def test_after_repeated_refusals_the_claim_runs_unprepared(sent, monkeypatch):
    """A pool whose server connections keep disagreeing with the client costs at most
    ``MAX_SENDS`` messages; then the claim runs as an unprepared statement."""
    monkeypatch.setattr(_prepared, "MAX_SENDS", 1)
    assert claim() == []  # prepares it
    job = flaky_sync.enqueue("k", failures=0)
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")
    sent.clear()
    (again,) = claim()
    assert (again.id, again.lease_version) == (job.id, 1)
    assert kinds(sent) == [("SET", True), ("SET", False)]  # refused once, then the plain claim


def test_inside_a_transaction_and_with_the_setting_off_the_claim_is_not_prepared(sent):
    flaky_sync.enqueue("k", failures=0)
    flaky_sync.enqueue("k", failures=0)
    with transaction.atomic():
        sent.clear()
        assert len(claim(limit=1)) == 1
        assert not any("PREPARE" in s or "EXECUTE" in s for s in sent), sent
    with override_settings(LEASEQUEUE={"PREPARED_STATEMENTS": False}):
        sent.clear()
        assert len(claim()) == 1
        assert kinds(sent) == [("SET", False)]
    assert statements_prepared() == []


def test_prepared_statements_must_be_a_bool():
    assert build({"PREPARED_STATEMENTS": False}).prepared_statements is False
    assert build({}).prepared_statements is True
    with pytest.raises(ConfigurationError,
                       match=r"LEASEQUEUE\['PREPARED_STATEMENTS'\] must be True or False, got 'yes'"):
        build({"PREPARED_STATEMENTS": "yes"})


def test_server_side_binding_claims_unprepared(sent, monkeypatch):
    """Server-side binding takes one statement per message: the claim then runs unprepared (its
    JIT switch in a short transaction of its own), and prepares nothing."""
    monkeypatch.setitem(connection.settings_dict, "OPTIONS", {**connection.settings_dict.get("OPTIONS", {}),
                                                               "server_side_binding": True})
    connection.close()
    job = flaky_sync.enqueue("k", failures=0)
    sent.clear()
    assert [j.id for j in claim()] == [job.id]
    assert not any(s.startswith(("PREPARE", "EXECUTE")) or "EXECUTE leasequeue_" in s for s in sent), sent
    assert statements_prepared() == []


@pytest.mark.parametrize("kind", ["queues", "any_queue", "fair"])
def test_the_prepared_claims_generic_plan_probes_the_primary_key_per_picked_job(kind, sent_with_params):
    """The generic plan does not know the LIMIT: it expects a tenth of the due rows. Joined to the
    table by a join, a plan made behind a large backlog walked the primary key from the lowest id,
    through every leased and finished row below them (a drain's claims slowed as it went, an idle
    job's start took over 10 ms). The claims select them by ``id = ANY(ARRAY(...))``: one
    primary-key probe per picked row, whatever the estimate."""
    # The plan is made at the connection's first claim, here behind a backlog of 20,000 due jobs,
    # with index probes priced high for this session (random_page_cost), as on a table larger than
    # the cache: the planner then prefers a join that walks the whole primary key, unless the
    # claim's statement leaves it no join to choose.
    with connection.cursor() as cur:
        cur.execute("INSERT INTO leasequeue_job (task, queue, priority, max_attempts, args, kwargs, run_at, "
                    "created_at) SELECT 'invoices.tasks.flaky_sync', 'default', 0, 3, '[\"d\"]', '{\"failures\": 0}', "
                    "leasequeue_now(), leasequeue_now() FROM generate_series(1, 20000)")
        cur.execute("ANALYZE leasequeue_job")
        cur.execute("SET random_page_cost = 100")
    queues = {"queues": ["default"], "any_queue": None, "fair": ["default"]}[kind]
    fair = frozenset({"default"}) if kind == "fair" else frozenset()
    sent_with_params.clear()
    claimed = store.job_claim(queues=queues, limit=1, worker_id="t:1:a", lease=30, fair_queues=fair)
    assert len(claimed) == 1
    ((message, params),) = [(s, p) for s, p in sent_with_params if "EXECUTE leasequeue_" in s]
    execute = message.rsplit("; ", 1)[1]
    with connection.cursor() as cur:
        cur.execute(f"{PREPARED_CLAIM_SETTINGS}; EXPLAIN {execute}", params)
        while cur.nextset():
            pass
        plan = "\n".join(row[0] for row in cur.fetchall())
        cur.execute("RESET random_page_cost")
    assert "Merge Join" not in plan and "Hash Join" not in plan, plan
    probe = r"Index Scan using leasequeue_job_pkey on leasequeue_job j\b.*\n\s+Index Cond: \(id = ANY"
    assert re.search(probe, plan), plan
