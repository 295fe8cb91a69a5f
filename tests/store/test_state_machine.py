"""A Hypothesis state machine of the job lifecycle against the real database.

Rules drive the store's own statements with an explicit ``now`` (the model's clock): enqueue,
claim by one of three workers, heartbeat (renew), fenced transactional completion
(``JobContext.fenced_atomic()`` writing an effect row), batched completion, fail (retry or dead),
snooze, release, the clock moving on (leases expire), reap, cancel requests, and replay (when the
store has ``job_replay``). Every handle a claim returns stays in play after its lease is gone, so
stale workers keep writing with old tokens.

A plain Python model predicts every outcome; after every step these invariants of the lifecycle
are checked against the rows:

* no double claim: no (job, token) pair is ever handed out twice, and a leased job has exactly one
  holder of its current token;
* fenced writes: a write with a stale token changes nothing (the row is compared field by field);
  only the current holder's writes take effect;
* fenced transactional completion: every effect row belongs to a ``done`` job and carries that
  job's final token; a refused completion leaves no effect;
* the fencing token (``lease_version``) never decreases;
* status transitions follow the lifecycle diagram;
* count in = count out: every enqueued job is there, in exactly one status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, precondition, rule
from qa.models import Effect

from django_leasequeue import store
from django_leasequeue.context import JobContext
from django_leasequeue.exceptions import JobCancelled, LeaseLost
from django_leasequeue.models import Job
from django_leasequeue.store import NewJob

BASE = datetime(2030, 1, 1, tzinfo=UTC)
# Django 6.1 renamed savepoint() to savepoint_create(); 5.2 LTS only has the old name.
_savepoint = getattr(transaction, "savepoint_create", None) or transaction.savepoint
WORKERS = ["w1", "w2", "w3"]
LEASES = [1.0, 2.5, 5.0]
MAX_SNOOZES = 2
HAS_REPLAY = hasattr(store, "job_replay")

# The lifecycle diagram (docs/explanation/design.md), plus staying put.
LEGAL = {
    ("ready", "leased"), ("ready", "cancelled"),
    ("leased", "done"), ("leased", "ready"), ("leased", "dead"), ("leased", "cancelled"),
    ("dead", "ready"), ("cancelled", "ready"),  # replay
}


@dataclass
class ModelJob:
    id: int
    priority: int
    max_attempts: int
    run_at: datetime
    status: str = "ready"
    attempts: int = 0
    token: int = 0
    leased_until: datetime | None = None
    cancel_requested: bool = False
    snoozes: int = 0
    errors: int = 0
    effects: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Handle:
    """What a worker got from a claim: the job, its token and lease, for every later write."""

    worker: str
    claim: store.ClaimedJob

    @property
    def job_id(self) -> int:
        return self.claim.id

    @property
    def token(self) -> int:
        return self.claim.lease_version


ROW_FIELDS = ("status", "attempts", "lease_version", "leased_until", "run_at", "cancel_requested", "snoozes",
              "errors", "result", "history")


class JobLifecycle(RuleBasedStateMachine):
    jobs = Bundle("jobs")
    handles = Bundle("handles")

    def __init__(self) -> None:
        super().__init__()
        # Each example runs in a savepoint of the test's transaction, rolled back at teardown.
        self.savepoint = _savepoint()
        self.now = BASE
        self.model: dict[int, ModelJob] = {}
        self.issued: dict[tuple[int, int], int] = {}  # (job, token) -> claims that handed it out
        self.last_status: dict[int, str] = {}
        self.last_token: dict[int, int] = {}

    def teardown(self) -> None:
        transaction.savepoint_rollback(self.savepoint)

    # -- helpers -------------------------------------------------------------------------------
    def holds(self, h: Handle) -> bool:
        job = self.model[h.job_id]
        return job.status == "leased" and job.token == h.token

    def row(self, job_id: int) -> dict:
        return Job.objects.values(*ROW_FIELDS).get(pk=job_id)

    def unchanged_unless_held(self, h: Handle, write) -> tuple[bool, object]:
        """Run ``write``; if ``h`` does not hold the lease, assert the row did not change at all."""
        held = self.holds(h)
        before = self.row(h.job_id)
        result = write()
        if not held:
            assert self.row(h.job_id) == before, f"a stale token ({h}) changed job {h.job_id}"
        return held, result

    def finish(self, job: ModelJob, status: str) -> None:
        job.status, job.leased_until = status, None

    # -- rules ---------------------------------------------------------------------------------
    @rule(target=jobs, n=st.integers(1, 3), max_attempts=st.integers(1, 3), delay=st.sampled_from([0.0, 1.0, 4.0]),
          priority=st.sampled_from([-1, 0, 1]))
    def enqueue(self, n, max_attempts, delay, priority):
        rows = store.job_insert([NewJob(task="qa.chaos", queue="default", priority=priority, args_json="[]",
                                        kwargs_json="{}", max_attempts=max_attempts, delay=delay)
                                 for _ in range(n)], notify=False, channel="leasequeue", now=self.now)
        assert len(rows) == n
        for r in rows:
            self.model[r.id] = ModelJob(r.id, priority, max_attempts, self.now + timedelta(seconds=delay))
        return multiple(*(r.id for r in rows))

    @rule(target=handles, worker=st.sampled_from(WORKERS), limit=st.integers(1, 3), lease=st.sampled_from(LEASES))
    def claim(self, worker, limit, lease):
        due = sorted((j for j in self.model.values() if j.status == "ready" and j.run_at <= self.now),
                     key=lambda j: (-j.priority, j.run_at, j.id))
        expected = [j.id for j in due[:limit]]
        claimed = store.job_claim(queues=["default"], limit=limit, worker_id=worker, lease=lease, now=self.now,
                                  rate_limits={})
        assert [c.id for c in claimed] == expected
        out = []
        for c in claimed:
            job = self.model[c.id]
            job.status, job.attempts, job.token = "leased", job.attempts + 1, job.token + 1
            job.leased_until = self.now + timedelta(seconds=lease)
            assert (c.attempts, c.lease_version, c.leased_until) == (job.attempts, job.token, job.leased_until)
            key = (c.id, c.lease_version)
            assert key not in self.issued, f"token handed out twice: {key}"  # invariant 1
            self.issued[key] = 1
            out.append(Handle(worker, c))
        return multiple(*out)

    @rule(h=handles, lease=st.sampled_from(LEASES))
    def heartbeat(self, h, lease):
        held, renewed = self.unchanged_unless_held(
            h, lambda: store.job_renew([(h.job_id, h.token, lease)], now=self.now))
        assert (h.job_id in renewed) == held
        if held:
            job = self.model[h.job_id]
            job.leased_until = self.now + timedelta(seconds=lease)
            assert renewed[h.job_id].leased_until == job.leased_until
            assert renewed[h.job_id].cancel_requested == job.cancel_requested

    @rule(h=handles)
    def complete_fenced(self, h):
        """The handler commits its effect and the job's done in one transaction (invariant 3)."""
        ctx = JobContext(job_id=h.job_id, task="qa.chaos", queue="default", attempt=h.claim.attempts,
                         max_attempts=h.claim.max_attempts, lease_version=h.token, worker_id=h.worker,
                         leased_until=h.claim.leased_until, lease_seconds=h.claim.lease_seconds)

        def write():
            try:
                with ctx.fenced_atomic():
                    Effect.objects.create(key=f"job-{h.job_id}", job_id=h.job_id, lease_version=h.token)
            except LeaseLost:
                return "lost"
            except JobCancelled:  # what the executor does next
                assert store.job_cancel_leased(h.job_id, h.token, now=self.now)
                return "cancelled"
            return "done"

        held, outcome = self.unchanged_unless_held(h, write)
        job = self.model[h.job_id]
        if not held:
            assert outcome == "lost"
        elif job.cancel_requested:
            assert outcome == "cancelled"
            self.finish(job, "cancelled")
        else:
            assert outcome == "done"
            self.finish(job, "done")
            job.effects.append(h.token)

    @rule(h=handles)
    def complete_batched(self, h):
        """The worker's completer: a fenced UPDATE for a handler that returned a value."""
        held, done = self.unchanged_unless_held(h, lambda: store.job_complete([(h.job_id, h.token, "1")],
                                                                              now=self.now))
        job = self.model[h.job_id]
        if not held:
            assert not done and not done.cancelled
        elif job.cancel_requested:
            assert h.job_id in done.cancelled
            self.finish(job, "cancelled")
        else:
            assert h.job_id in done
            self.finish(job, "done")

    @rule(h=handles, delay=st.sampled_from([None, 0.0, 2.0]))
    def fail(self, h, delay):
        error = {"attempt": h.claim.attempts, "type": "builtins.ValueError", "message": "x", "traceback": "",
                 "worker": h.worker}
        held, outcome = self.unchanged_unless_held(
            h, lambda: store.job_fail(h.job_id, h.token, error, retry_delay=delay, now=self.now))
        if not held:
            assert outcome is None
            return
        job = self.model[h.job_id]
        job.errors += 1
        if job.cancel_requested:
            self.finish(job, "cancelled")
        elif delay is None or job.attempts >= job.max_attempts:
            self.finish(job, "dead")
        else:
            self.finish(job, "ready")
            job.run_at = self.now + timedelta(seconds=delay)
        assert outcome[0] == job.status

    @rule(h=handles, seconds=st.sampled_from([0.0, 3.0]))
    def snooze(self, h, seconds):
        held, outcome = self.unchanged_unless_held(
            h, lambda: store.job_snooze(h.job_id, h.token, seconds, max_snoozes=MAX_SNOOZES, now=self.now))
        if not held:
            assert outcome is None
            return
        job = self.model[h.job_id]
        if job.cancel_requested:
            self.finish(job, "cancelled")
        elif job.snoozes >= MAX_SNOOZES:
            self.finish(job, "dead")
            job.errors += 1
            job.snoozes += 1
        else:
            self.finish(job, "ready")
            job.run_at = self.now + timedelta(seconds=seconds)
            job.attempts = max(job.attempts - 1, 0)
            job.snoozes += 1
        assert outcome == job.status

    @rule(h=handles)
    def release(self, h):
        """Graceful shutdown gives the lease back: not an attempt, token bumped."""
        held, released = self.unchanged_unless_held(h, lambda: store.job_release([(h.job_id, h.token)],
                                                                                 now=self.now))
        assert (h.job_id in released) == held
        if held:
            job = self.model[h.job_id]
            self.finish(job, "cancelled" if job.cancel_requested else "ready")
            job.run_at, job.attempts, job.token = self.now, max(job.attempts - 1, 0), job.token + 1

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0, 10.0]))
    def advance_clock(self, seconds):
        """Time passes (database time: the explicit ``now`` of every statement)."""
        self.now += timedelta(seconds=seconds)

    @rule()
    def reap(self):
        expected = {j.id for j in self.model.values() if j.status == "leased" and j.leased_until < self.now}
        reaped = store.job_reap_expired(now=self.now)
        assert {r.id for r in reaped} == expected
        for r in reaped:
            job = self.model[r.id]
            job.token += 1
            job.errors += 1
            job.run_at = self.now
            if job.cancel_requested:
                self.finish(job, "cancelled")
            elif job.attempts >= job.max_attempts:
                self.finish(job, "dead")
            else:
                self.finish(job, "ready")
            assert (r.status, r.lease_version) == (job.status, job.token)

    @rule(picked=st.lists(jobs, min_size=1, max_size=3))
    def cancel(self, picked):
        counts = store.job_request_cancel(picked, by="model", now=self.now)
        cancelled = requested = 0
        for job_id in set(picked):
            job = self.model[job_id]
            if job.status == "ready":
                self.finish(job, "cancelled")
                cancelled += 1
            elif job.status == "leased" and not job.cancel_requested:
                job.cancel_requested = True
                requested += 1
        assert (counts.cancelled, counts.requested) == (cancelled, requested)

    @precondition(lambda self: HAS_REPLAY)
    @rule(job_id=jobs)
    def replay(self, job_id):
        result = store.job_replay([job_id], by="model", now=self.now)
        job = self.model[job_id]
        if job.status in ("dead", "cancelled"):
            assert result.replayed == [job_id]
            job.status, job.attempts, job.token, job.run_at = "ready", 0, job.token + 1, self.now
            job.cancel_requested, job.snoozes, job.leased_until = False, 0, None
        else:
            assert result.replayed == []

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def rows_match_the_model_and_the_invariants_hold(self):
        rows = {r["id"]: r for r in Job.objects.values("id", *ROW_FIELDS)}
        # Count in = count out: every enqueued job is there, once, in one of the five statuses.
        assert set(rows) == set(self.model)
        for job_id, job in self.model.items():
            r = rows[job_id]
            assert (r["status"], r["attempts"], r["lease_version"], r["leased_until"], r["cancel_requested"],
                    r["snoozes"], len(r["errors"])) == (job.status, job.attempts, job.token, job.leased_until,
                                                         job.cancel_requested, job.snoozes, job.errors), job_id
            if job.status == "ready":
                assert r["run_at"] == job.run_at
            # The fencing token never goes back; transitions follow the lifecycle.
            assert r["lease_version"] >= self.last_token.get(job_id, 0)
            prev = self.last_status.get(job_id, "ready")
            assert prev == r["status"] or (prev, r["status"]) in LEGAL, (job_id, prev, r["status"])
            self.last_token[job_id], self.last_status[job_id] = r["lease_version"], r["status"]
            # No double holder: a leased job's current token was handed out by exactly one claim.
            if r["status"] == "leased":
                assert self.issued.get((job_id, r["lease_version"])) == 1
        # Fenced transactional completion: effects only for done jobs, under their final token.
        effects: dict[int, list[int]] = {}
        for job_id, token in Effect.objects.values_list("job_id", "lease_version"):
            effects.setdefault(job_id, []).append(token)
        for job_id, job in self.model.items():
            assert sorted(effects.get(job_id, [])) == sorted(job.effects), job_id
        for job_id, tokens in effects.items():
            r = rows[job_id]
            for token in tokens:
                # A replayed job may have completed before: its older effects stay, each under a
                # token it was done with; the latest belongs to the current done token.
                assert token <= r["lease_version"]
            if r["status"] == "done":
                assert max(tokens) == r["lease_version"]


@pytest.mark.django_db
def test_job_lifecycle_state_machine():
    JobLifecycle.TestCase.settings = settings(
        max_examples=100, stateful_step_count=40, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    JobLifecycle.TestCase().runTest()
