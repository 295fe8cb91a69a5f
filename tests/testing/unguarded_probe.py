"""Run only by tests/testing/test_database_safety.py, in a subprocess: a test that opens database
access without any of pytest-django's database fixtures, so no test database is created for it."""

from django.db import connection


def test_unblocked_query_without_a_test_database(django_db_blocker):
    with django_db_blocker.unblock(), connection.cursor() as cur:
        cur.execute("DELETE FROM leasequeue_job")
