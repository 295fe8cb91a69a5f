"""Retries decided by the error, through the real executor on PostgreSQL: ``retry_on``,
``discard_on``, a backoff that receives the exception, and ``raise Retry(...)``.

Delays are read back from the row as ``run_at - errors[i].at``: both come from the same statement
clock, so the difference is exactly the delay the executor asked for.
"""

from datetime import UTC, datetime, timedelta

import pytest
from qa.models import Execution

from django_leasequeue import Backoff, ConfigurationError, Retry, store, task
from django_leasequeue.conf import get_settings
from django_leasequeue.exceptions import JobTimedOut
from django_leasequeue.executor import Executor
from django_leasequeue.models import Job
from tests.support import claim, context_for, error_time, run_claimed

pytestmark = pytest.mark.django_db


@task(name="tests.rd_discard", max_attempts=5, discard_on=(KeyError, OSError))
def rd_discard(kind: str) -> None:
    raise {"key": KeyError("no such record"), "file": FileNotFoundError("gone"), "value": ValueError("odd")}[kind]


@task(name="tests.rd_retry_on", max_attempts=3, retry_on=ConnectionError, backoff=0)
def rd_retry_on(kind: str) -> None:
    raise {"conn": ConnectionResetError("reset"), "value": ValueError("bad input")}[kind]


@task(name="tests.rd_both", max_attempts=4, retry_on=OSError, discard_on=FileNotFoundError, backoff=0)
def rd_both(kind: str) -> None:
    raise {"file": FileNotFoundError("gone"), "conn": ConnectionError("down")}[kind]


def _per_error(attempt: int, exc: BaseException) -> float | None:
    if isinstance(exc, ConnectionError):
        return 5.0 * attempt
    if isinstance(exc, TimeoutError):
        return 30.0
    return None  # the BACKOFF_* settings' delay


@task(name="tests.rd_per_error", max_attempts=5, backoff=_per_error)
def rd_per_error(kind: str) -> None:
    raise {"conn": ConnectionError("down"), "timeout": TimeoutError("slow"), "value": ValueError("odd")}[kind]


def _broken_backoff(attempt: int, exc: BaseException) -> float:
    raise RuntimeError("backoff bug")


@task(name="tests.rd_broken_backoff", max_attempts=3, backoff=_broken_backoff)
def rd_broken_backoff() -> None:
    raise ConnectionError("down")


@task(name="tests.rd_retry", max_attempts=2, retry_on=ConnectionError,
      backoff=Backoff(base=9, factor=1, max=9, jitter=0))
def rd_retry(at: str | None = None, delay: float | None = None, reason: str = "", bad: str = "") -> None:
    if bad == "naive":
        raise Retry(at=datetime(2030, 1, 1))
    if bad == "both":
        raise Retry(5, at=datetime(2030, 1, 1, tzinfo=UTC))
    if bad == "negative":
        raise Retry(-1)
    raise Retry(delay, at=None if at is None else datetime.fromisoformat(at), reason=reason)


@task(name="tests.rd_plain_retry", max_attempts=3)
def rd_plain_retry(bad: str) -> None:
    if bad == "naive":
        raise Retry(at=datetime(2030, 1, 1))
    if bad == "both":
        raise Retry(5, at=datetime(2030, 1, 1, tzinfo=UTC))
    raise Retry(-1)


def run_one(job: Job) -> str:
    (claimed,) = claim()
    outcome = run_claimed(claimed)
    job.refresh_from_db()
    return outcome


def delay_of(job: Job) -> timedelta:
    return job.run_at - error_time(job.errors[-1])


@pytest.mark.parametrize("kind, error_type", [("key", "builtins.KeyError"),
                                              ("file", "builtins.FileNotFoundError")])  # a subclass of OSError
def test_discard_on_dead_letters_after_exactly_one_attempt(kind, error_type):
    job = rd_discard.enqueue(kind)
    assert run_one(job) == "dead"
    assert (job.status, job.attempts, job.max_attempts, len(job.errors)) == ("dead", 1, 5, 1)
    entry = job.errors[0]
    assert entry["type"] == error_type and entry["attempt"] == 1
    assert entry["decision"] == "discarded"
    assert entry["reason"] == f"{error_type.split('.')[1]} matches discard_on (KeyError, OSError)"
    assert job.finished_at == error_time(entry)
    assert claim() == []


def test_an_error_discard_on_does_not_name_is_retried_as_usual():
    job = rd_discard.enqueue("value")
    assert run_one(job) == "ready"
    assert (job.status, job.attempts) == ("ready", 1)
    assert "decision" not in job.errors[0] and "reason" not in job.errors[0]


def test_retry_on_a_non_matching_error_is_dead_after_one_attempt():
    job = rd_retry_on.enqueue("value")
    assert run_one(job) == "dead"
    assert (job.status, job.attempts, len(job.errors)) == ("dead", 1, 1)
    assert job.errors[0]["type"] == "builtins.ValueError"
    assert job.errors[0]["decision"] == "not_retryable"
    assert job.errors[0]["reason"] == "ValueError matches no retry_on class (ConnectionError)"


def test_retry_on_a_matching_error_is_retried_until_max_attempts_then_dead():
    job = rd_retry_on.enqueue("conn")  # ConnectionResetError: a subclass of ConnectionError
    outcomes = [run_one(job) for _ in range(3)]
    assert outcomes == ["ready", "ready", "dead"]
    assert (job.status, job.attempts, job.lease_version) == ("dead", 3, 3)
    assert [e["attempt"] for e in job.errors] == [1, 2, 3]
    assert {e["type"] for e in job.errors} == {"builtins.ConnectionResetError"}
    assert not any("decision" in e for e in job.errors)  # exhausted, not decided by the error
    assert claim() == []


def test_discard_on_wins_over_retry_on_when_both_match():
    discarded = rd_both.enqueue("file")
    assert run_one(discarded) == "dead"
    assert (discarded.attempts, discarded.errors[0]["decision"]) == (1, "discarded")
    retried = rd_both.enqueue("conn")
    assert run_one(retried) == "ready"
    assert retried.attempts == 1 and "decision" not in retried.errors[0]


@pytest.mark.parametrize("kind, delays", [("conn", [5, 10, 15]), ("timeout", [30, 30, 30])])
def test_backoff_with_the_exception_sets_run_at_to_failure_time_plus_its_delay(db_clock, kind, delays):
    job = rd_per_error.enqueue(kind)
    seen = []
    for _ in range(3):
        assert run_one(job) == "ready"
        seen.append(delay_of(job))
        db_clock.advance(seen[-1].total_seconds())
    assert seen == [timedelta(seconds=d) for d in delays]
    assert job.attempts == 3


def test_backoff_returning_none_uses_the_settings_default(db_clock):
    # testproject: BACKOFF_BASE 1 s, jitter 0.5: attempt 1 waits between 0.5 and 1 s.
    job = rd_per_error.enqueue("value")
    assert run_one(job) == "ready"
    assert timedelta(seconds=0.5) <= delay_of(job) <= timedelta(seconds=1)


def test_a_backoff_that_raises_falls_back_to_the_default_and_logs(caplog):
    job = rd_broken_backoff.enqueue()
    with caplog.at_level("ERROR", logger="django_leasequeue.executor"):
        assert run_one(job) == "ready"
    assert timedelta(seconds=0.5) <= delay_of(job) <= timedelta(seconds=1)
    assert job.errors[0]["type"] == "builtins.ConnectionError"  # the handler's error, not the backoff's
    assert any("the task's backoff failed; using the default" in r.getMessage() for r in caplog.records)


def test_retry_at_sets_run_at_exactly_and_records_the_reason_then_dead_at_max_attempts(db_clock):
    at = store.db_now() + timedelta(days=3, seconds=7, microseconds=123457)
    job = rd_retry.enqueue(at=at.isoformat(), reason="quota resets at midnight")
    assert run_one(job) == "ready"
    assert (job.status, job.attempts, job.run_at) == ("ready", 1, at)
    entry = job.errors[0]
    assert entry["type"] == "django_leasequeue.exceptions.Retry"
    assert (entry["decision"], entry["reason"]) == ("retry_requested", "quota resets at midnight")
    assert entry["message"] == f"retry requested at {at.isoformat()}: quota resets at midnight"
    assert claim() == []  # not due before ``at``
    db_clock.advance((at - store.db_now()).total_seconds() + 0.001)
    assert run_one(job) == "dead"  # the second of max_attempts=2: a Retry on the last attempt dead-letters
    assert (job.status, job.attempts, len(job.errors)) == ("dead", 2, 2)
    assert job.errors[1]["decision"] == "retry_requested"


def test_retry_at_a_past_time_is_due_at_the_failure_time():
    job = rd_retry.enqueue(at=datetime(2001, 1, 1, tzinfo=UTC).isoformat())
    assert run_one(job) == "ready"
    assert job.run_at == error_time(job.errors[0])
    assert "reason" not in job.errors[0]


def test_retry_delay_and_retry_without_a_time_use_the_delay_then_the_backoff():
    delayed = rd_retry.enqueue(delay=42.5, reason="later")
    assert run_one(delayed) == "ready"
    assert delay_of(delayed) == timedelta(seconds=42.5)
    assert delayed.errors[0]["message"] == "retry requested in 42.5 s: later"
    Job.objects.all().delete()
    backoff = rd_retry.enqueue()
    assert run_one(backoff) == "ready"
    assert delay_of(backoff) == timedelta(seconds=9)  # the task's Backoff(base=9, jitter=0)
    assert backoff.errors[0]["message"] == "retry requested after the backoff"


@pytest.mark.parametrize("bad, message", [
    ("naive", "Retry at must be an aware datetime, got datetime.datetime(2030, 1, 1, 0, 0)"),
    ("both", "Retry takes delay or at, not both"),
    ("negative", "Retry delay must be a finite number of seconds from 0 to 100 years, got -1"),
])
def test_a_bad_retry_fails_the_attempt_as_an_ordinary_value_error(bad, message):
    plain = rd_plain_retry.enqueue(bad)  # no retry_on: the ValueError is retried after the backoff
    assert run_one(plain) == "ready"
    assert (plain.errors[0]["type"], plain.errors[0]["message"]) == ("builtins.ValueError", message)
    assert "decision" not in plain.errors[0]
    Job.objects.all().delete()
    strict = rd_retry.enqueue(bad=bad)  # retry_on=ConnectionError: the ValueError is not retryable
    assert run_one(strict) == "dead"
    assert (strict.attempts, strict.errors[0]["decision"]) == (1, "not_retryable")


def test_retry_is_not_subject_to_retry_on():
    job = rd_retry.enqueue(delay=1)  # the task's retry_on=ConnectionError does not name Retry
    assert run_one(job) == "ready"
    assert job.errors[0]["decision"] == "retry_requested"


def _executor() -> Executor:
    return Executor(worker_id="test:0:t", settings=get_settings(), alias=store.db_alias(), complete=lambda *a: None)


@task(name="tests.rd_timeout_not_listed", max_attempts=3, retry_on=ConnectionError)
def rd_timeout_not_listed() -> None: ...


@task(name="tests.rd_timeout_listed", max_attempts=3, retry_on=(ConnectionError, JobTimedOut), backoff=1)
def rd_timeout_listed() -> None: ...


def test_a_timeout_is_an_exception_retry_on_may_list():
    not_listed = rd_timeout_not_listed.enqueue()
    (claimed,) = claim()
    assert _executor().record_timeout(claimed, context_for(claimed), "stuck", min_delay=30) == "dead"
    not_listed.refresh_from_db()
    assert (not_listed.attempts, not_listed.errors[0]["type"], not_listed.errors[0]["decision"]) == \
        (1, "django_leasequeue.exceptions.JobTimedOut", "not_retryable")
    listed = rd_timeout_listed.enqueue()
    (claimed,) = claim()
    assert _executor().record_timeout(claimed, context_for(claimed), "stuck", min_delay=30) == "ready"
    listed.refresh_from_db()
    assert delay_of(listed) == timedelta(seconds=30)  # the lease's min_delay over the 1 s backoff


def test_a_process_mode_child_decides_with_the_real_exception():
    # child._decide runs in the child, where the exception object is; the worker gets the decision.
    import qa.tasks  # noqa: F401 - registers the qa tasks, as the child's autodiscover() does

    from django_leasequeue.child import _decide
    from django_leasequeue.retry import RetryDecision

    assert _decide("qa.discarded_error", PermissionError("no"), 1) == RetryDecision(
        delay=None, decision="discarded", reason="PermissionError matches discard_on (PermissionError)")
    assert _decide("qa.flaky_until_third", ConnectionError("down"), 1) == RetryDecision(delay=0.05)
    assert _decide("qa.flaky_until_third", ValueError("odd"), 1).decision == "not_retryable"
    assert _decide("no.such.task", ValueError("odd"), 1) is None  # the worker decides from the entry


def test_the_worker_uses_the_childs_decision_over_its_own():
    from django_leasequeue.executor import ChildError
    from django_leasequeue.retry import RetryDecision

    job = rd_retry_on.enqueue("conn")
    (claimed,) = claim()
    chosen = RetryDecision(delay=None, decision="discarded", reason="decided in the child")
    error = ChildError({"type": "builtins.ConnectionResetError", "message": "reset", "traceback": ""}, chosen)
    assert _executor()._decide(rd_retry_on, claimed, error) is chosen
    assert _executor()._fail(claimed, context_for(claimed), error, retry_delay=None, fields={},
                             decision=chosen) == "dead"
    job.refresh_from_db()
    assert (job.errors[0]["type"], job.errors[0]["reason"]) == ("builtins.ConnectionResetError", "decided in the child")
    assert Execution.objects.count() == 0


def test_a_child_error_without_a_decision_is_an_ordinary_failure():
    # Only the description came back: it is not matched against retry_on=ConnectionError.
    from django_leasequeue.executor import ChildError
    from django_leasequeue.retry import RetryDecision

    rd_retry_on.enqueue("value")
    (claimed,) = claim()
    error = ChildError({"type": "builtins.ValueError", "message": "bad input", "traceback": ""})
    assert _executor()._decide(rd_retry_on, claimed, error) == RetryDecision(delay=0.0)  # the task's backoff=0


class NotAnError:
    pass


@pytest.mark.parametrize("options, message", [
    ({"retry_on": "ValueError"}, "retry_on must be an exception class or a tuple of them, got 'ValueError'"),
    ({"retry_on": ValueError("x")}, "retry_on must be an exception class or a tuple of them, got ValueError('x')"),
    ({"discard_on": (KeyError, NotAnError)}, "discard_on must be an exception class or a tuple of them"),
    ({"discard_on": ()}, "discard_on must be an exception class or a tuple of them, got ()"),
    ({"backoff": lambda: 1}, "must take (attempt) or (attempt, exc), not the parameters ()"),
    ({"backoff": lambda a, e, x: 1}, "must take (attempt) or (attempt, exc), not the parameters (a, e, x)"),
    ({"backoff": lambda a, *, k: 1}, "must take (attempt) or (attempt, exc), not the parameters (a, *, k)"),
])
def test_bad_declarations_raise_configuration_error(options, message):
    with pytest.raises(ConfigurationError, match="^task 'tests.rd_bad': ") as info:
        task(name="tests.rd_bad", **options)(lambda: None)
    assert message in str(info.value)


def test_backoff_arity_is_told_apart_by_the_signature():
    from django_leasequeue.retry import backoff_takes_exception

    assert backoff_takes_exception(lambda attempt, exc: 1) is True
    assert backoff_takes_exception(lambda *args: 1) is True
    assert backoff_takes_exception(lambda attempt=1, exc=None: 1) is True
    assert backoff_takes_exception(lambda attempt: 1) is False
    assert backoff_takes_exception(Backoff().delay) is False  # (attempt, rng=random.random)
    assert backoff_takes_exception(abs) is False


def test_the_dead_lettered_and_retried_events_carry_the_decision_and_reason():
    from django_leasequeue import signals

    seen: list[tuple[str, dict]] = []

    def receiver(sender, event, **kwargs):
        seen.append((event, kwargs))

    for signal in signals.SIGNALS.values():
        signal.connect(receiver, dispatch_uid="retry-decision-test")
    try:
        discarded = rd_discard.enqueue("key")
        assert run_one(discarded) == "dead"
        asked = rd_retry.enqueue(delay=3, reason="later")
        assert run_one(asked) == "ready"
        plain = rd_retry_on.enqueue("conn")
        assert run_one(plain) == "ready"
    finally:
        for signal in signals.SIGNALS.values():
            signal.disconnect(dispatch_uid="retry-decision-test")
    ended = {kw["job_id"]: (event, kw.get("decision"), kw.get("reason")) for event, kw in seen
             if event in ("dead_lettered", "retried")}
    assert ended == {
        discarded.id: ("dead_lettered", "discarded", "KeyError matches discard_on (KeyError, OSError)"),
        asked.id: ("retried", "retry_requested", "later"),
        plain.id: ("retried", None, None),
    }
