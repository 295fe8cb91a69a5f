"""The claim turns JIT compilation off for its connection's session: on a large backlog its cost
estimate crosses ``jit_above_cost`` and compiling costs about a hundred times the claim."""

import pytest
from django.db import connection, transaction

from django_leasequeue import store

pytestmark = pytest.mark.django_db(transaction=True)


def jit() -> str:
    with connection.cursor() as cur:
        cur.execute("SHOW jit")
        return cur.fetchone()[0]


def test_a_claim_outside_a_transaction_turns_jit_off_for_the_session_once():
    with connection.cursor() as cur:
        cur.execute("SET jit = on")
    store.job_claim(queues=["default"], limit=1, worker_id="t:1:a", lease=30)
    assert jit() == "off"
    with connection.cursor() as cur:  # once per connection: not set again by the next claim
        cur.execute("SET jit = on")
    store.job_claim(queues=["default"], limit=1, worker_id="t:1:a", lease=30)
    assert jit() == "on"
    connection.close()  # a new connection is a new session: set again
    store.job_claim(queues=["default"], limit=1, worker_id="t:1:a", lease=30)
    assert jit() == "off"


def test_a_claim_inside_a_callers_transaction_leaves_the_session_alone():
    connection.close()
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute("SET jit = on")
        store.job_claim(queues=["default"], limit=1, worker_id="t:1:a", lease=30)
        assert jit() == "on"
