"""Incident search on the job list and Dead letters: error type, error message,
arguments by jsonb containment, time of the last failure (relative, by the database clock, or an
explicit range in the admin's time zone), the operator's states; invalid input is a message, not a
500; the list machinery for large tables keeps working with a search applied."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_leasequeue import store

from .factories import ERROR, make_job

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_leasequeue_job_changelist")
DEAD = reverse("admin:django_leasequeue_deadletter_changelist")


def found(client, url: str, params: dict) -> list[int]:
    response = client.get(url, params)
    assert response.status_code == 200
    return sorted(j.id for j in response.context["cl"].result_list)


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def failed(kind: str = "builtins.ValueError", message: str = "boom", at=None, **fields):
    at = at or store.db_now()
    return make_job("dead", errors=[dict(ERROR, type=kind, message=message, at=at.isoformat())], **fields)


def test_error_type_by_class_name_or_full_name(admin_client):
    builtin = failed("builtins.ValueError")
    plain = failed("ValueError")
    mine = failed("billing.errors.ValueError")
    other = failed("builtins.KeyError")
    make_job("ready")
    assert found(admin_client, JOBS, {"error_type": "ValueError"}) == [builtin.id, plain.id, mine.id]
    assert found(admin_client, DEAD, {"error_type": "builtins.ValueError"}) == [builtin.id]
    assert found(admin_client, DEAD, {"error_type": "KeyError"}) == [other.id]


def test_error_message_is_a_case_insensitive_substring_of_the_last_error(admin_client):
    hit = failed(message="Card DECLINED for customer 7")
    old = make_job("dead", errors=[dict(ERROR, message="card declined"), dict(ERROR, message="timeout")])
    failed(message="timeout")
    assert found(admin_client, DEAD, {"error": "card declined"}) == [hit.id]
    assert old.id not in found(admin_client, DEAD, {"error": "declined"})


@pytest.mark.parametrize("typed", ['{"customer": "ACME"}', "customer=ACME", ' customer = "ACME" '])
def test_arguments_contain_a_key_and_value(admin_client, typed):
    in_kwargs = make_job("dead", kwargs={"customer": "ACME", "period": "2026-11"})
    in_args = make_job("dead", args=[{"customer": "ACME", "n": 1}], kwargs={})
    other = make_job("dead", kwargs={"customer": "ACME Corp"})
    nested = make_job("dead", kwargs={"payload": {"customer": "ACME"}})
    result = found(admin_client, JOBS, {"args": typed})
    assert result == [in_kwargs.id, in_args.id]
    assert other.id not in result and nested.id not in result


def test_arguments_contain_a_positional_value_and_a_nested_object(admin_client):
    by_id = make_job("dead", args=[42, "x"])
    by_word = make_job("dead", args=["ACME"])
    nested = make_job("dead", kwargs={"payload": {"customer": "ACME"}})
    assert found(admin_client, JOBS, {"args": "42"}) == [by_id.id]
    assert found(admin_client, JOBS, {"args": "ACME"}) == [by_word.id]
    assert found(admin_client, JOBS, {"args": '{"payload": {"customer": "ACME"}}'}) == [nested.id]
    assert found(admin_client, JOBS, {"args": "customer=42"}) == []


def test_bad_json_is_a_clear_message_not_a_500(admin_client):
    make_job("dead", kwargs={"customer": "ACME"})
    response = admin_client.get(JOBS, {"args": '{"customer": '})
    assert response.status_code == 200
    assert list(response.context["cl"].result_list) == []
    (message,) = messages_of(response)
    assert message.startswith("Search not applied: arguments: not valid JSON")
    assert 'value="{&quot;customer&quot;: "' in response.content.decode()  # the form keeps what was typed


def test_unknown_state_and_bad_times_are_messages(admin_client):
    make_job("ready")
    response = admin_client.get(JOBS, {"status": "exploded"})
    assert response.status_code == 200 and list(response.context["cl"].result_list) == []
    assert messages_of(response)[0].startswith("Unknown state 'exploded': choose one of ready, scheduled")
    response = admin_client.get(JOBS, {"failed_from": "yesterday-ish"})
    assert response.status_code == 200 and messages_of(response)[0].startswith("Search not applied:")
    response = admin_client.get(JOBS, {"failed_from": "2026-01-02 00:00", "failed_to": "2026-01-01 00:00"})
    assert messages_of(response) == ["Search not applied: failed from is after failed to."]
    response = admin_client.get(JOBS, {"failed": "3y"})
    assert response.status_code == 200 and messages_of(response)[0].startswith("Search not applied:")


def test_last_failure_within_is_judged_by_the_database_clock(admin_client, db_clock):
    now = store.db_now()
    recent = failed(at=now - timedelta(minutes=10))
    hour_ago = failed(at=now - timedelta(minutes=50))
    day_ago = failed(at=now - timedelta(hours=20))
    week_ago = failed(at=now - timedelta(days=6))
    assert found(admin_client, DEAD, {"failed": "15m"}) == [recent.id]
    assert found(admin_client, DEAD, {"failed": "1h"}) == [recent.id, hour_ago.id]
    assert found(admin_client, DEAD, {"failed": "24h"}) == [recent.id, hour_ago.id, day_ago.id]
    assert found(admin_client, DEAD, {"failed": "7d"}) == [recent.id, hour_ago.id, day_ago.id, week_ago.id]
    db_clock.advance(3600)  # an hour later by the database's clock: the recent failure is no longer recent
    assert found(admin_client, DEAD, {"failed": "15m"}) == []
    assert found(admin_client, DEAD, {"failed": "24h"}) == [recent.id, hour_ago.id, day_ago.id]


@override_settings(TIME_ZONE="America/New_York")
def test_an_explicit_range_is_read_in_the_admin_time_zone(admin_client):
    from datetime import datetime

    inside = failed(at=datetime(2026, 3, 1, 15, 30, tzinfo=UTC))   # 10:30 in New York
    before = failed(at=datetime(2026, 3, 1, 14, 30, tzinfo=UTC))   # 09:30 in New York
    params = {"failed_from": "2026-03-01 10:00:00", "failed_to": "2026-03-01 11:00:00"}
    assert found(admin_client, DEAD, params) == [inside.id]
    assert before.id in found(admin_client, DEAD, {"failed_from": "2026-03-01 09:00:00"})


def test_the_search_composes_with_task_queue_and_state(admin_client):
    hit = failed(kind="ValueError", queue="invoices", task="invoices.tasks.poison", kwargs={"customer": "ACME"})
    failed(kind="ValueError", queue="orders", task="invoices.tasks.poison", kwargs={"customer": "ACME"})
    failed(kind="KeyError", queue="invoices", task="invoices.tasks.poison", kwargs={"customer": "ACME"})
    params = {"queue": "invoices", "task": "invoices.tasks.poison", "status": "dead", "error_type": "ValueError",
              "args": "customer=ACME"}
    assert found(admin_client, JOBS, params) == [hit.id]


def test_states_judged_by_the_database_clock(admin_client, db_clock):
    now = store.db_now()
    due = make_job("ready")
    scheduled = make_job("ready", run_at=now + timedelta(hours=1))
    retry = make_job("ready", attempts=1, run_at=now + timedelta(minutes=5), attempted_at=now - timedelta(minutes=1),
                     errors=[dict(ERROR, at=(now - timedelta(seconds=50)).isoformat())])
    snoozed = make_job("ready", snoozes=1, run_at=now + timedelta(minutes=5), attempted_at=now - timedelta(minutes=1),
                       leased_by="h:1:w")
    leased = make_job("leased")
    expired = make_job("leased", leased_until=now - timedelta(seconds=5))
    expect = {"ready": [due.id], "scheduled": [scheduled.id], "retry wait": [retry.id], "snoozed": [snoozed.id],
              "leased": [leased.id], "lease expired": [expired.id]}
    for state, ids in expect.items():
        assert found(admin_client, JOBS, {"status": state}) == ids, state
    db_clock.advance(2 * 3600)  # later, by the database clock: all due; the live lease has run out
    assert found(admin_client, JOBS, {"status": "ready"}) == sorted([due.id, scheduled.id, retry.id, snoozed.id])
    assert found(admin_client, JOBS, {"status": "lease expired"}) == [leased.id, expired.id]


def test_large_table_machinery_keeps_working_with_a_search(admin_client):
    big = make_job("dead", kwargs={"customer": "ACME", "blob": "x" * 500_000},
                   errors=[dict(ERROR, message="card declined", at=store.db_now().isoformat())])
    with CaptureQueriesContext(connection) as ctx:
        response = admin_client.get(JOBS, {"args": "customer=ACME", "error": "declined", "failed": "7d"})
    assert [j.id for j in response.context["cl"].result_list] == [big.id]
    assert len(response.content) < 100_000
    for q in ctx.captured_queries:
        assert "DISTINCT" not in q["sql"], q["sql"]
        if 'FROM "leasequeue_job"' in q["sql"]:
            select_list = q["sql"].split(" FROM ")[0]
            assert '"leasequeue_job"."kwargs"' not in select_list
            assert not re.search(r'"leasequeue_job"\."errors"\s*(,|$)', select_list)
    counts = [q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper()]
    assert len(counts) == 1 and "LIMIT 10001" in counts[0]


def test_the_search_form_keeps_the_other_filters(admin_client):
    make_job("dead", queue="invoices")
    html = admin_client.get(JOBS, {"queue": "invoices", "error": "boom"}).content.decode()
    form = html[html.index('class="lq-search-form"'):]
    form = form[:form.index("</form>")]
    assert '<input type="hidden" name="queue" value="invoices">' in form
    assert 'name="error" value="boom"' in form


def test_the_fields_help_is_shown_where_the_inputs_point(admin_client):
    html = admin_client.get(DEAD).content.decode()
    for name in ("error_type", "args"):
        assert f'aria-describedby="id_{name}_helptext"' in html
        assert f'<div class="help" id="id_{name}_helptext">' in html
    assert "customer=ACME" in html


def test_dead_letters_show_for_whom_each_job_failed(admin_client):
    # "What broke in the last hour, and for whom?": the arguments are on the list, one line each.
    make_job("dead", kwargs={"customer": "ACME", "order": 9002})
    html = admin_client.get(DEAD).content.decode()
    text = "{&quot;order&quot;: 9002, &quot;customer&quot;: &quot;ACME&quot;}"  # kwargs (args [] left out)
    assert f'<span class="lq-args" title="{text}">{text}</span>' in html
