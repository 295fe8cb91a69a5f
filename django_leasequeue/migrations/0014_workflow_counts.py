# Workflow counters once per statement. The settle trigger (migration 0011; its function last
# replaced by 0012_workflow_release_snapshot, whose release of dependents is kept here unchanged)
# updated the workflow row once per member finished, so a batched completion of ~100 members
# updated one row ~100 times
# in one transaction (a long chain of row versions, none of them HOT because progressed_at is
# indexed, each found through all the earlier ones, with the row lock held throughout). Now each
# member's move is added to a running delta for its workflow, and the deltas are applied at the end
# of the statement, one UPDATE per workflow in workflow id order (or earlier, when a callback of a
# workflow finishes: the counters it reads must hold every member counted so far), which is where
# pending reaching 0 is seen and the workflow settled.
#
# The running deltas are the transaction-local setting leasequeue.workflow_delta, a JSON object
# {"<workflow id>": [pending, done, dead, cancelled, reopened]} (set_config(..., true)): it is
# undone with the rows when the statement or its savepoint rolls back, and nothing outlives the
# transaction. A statement-level trigger on the same event as the row trigger (UPDATE OF status)
# applies them; every other statement that sets a status (claims, retries) pays one call that
# reads the setting and returns. It cannot be a WHEN clause: a statement trigger's WHEN is
# evaluated when the event is queued, before the row triggers of the statement have run. The
# setting is cleared before the deltas are applied: whatever the apply runs (the settle releases
# or cancels callbacks, which fires these triggers again) starts from an empty one.
#
# Exactly once stays as it was: each move is in exactly one delta, each delta is applied once,
# under the workflow row's lock, so exactly one UPDATE sees members_pending reach 0. Applied in
# workflow id order, after the statement has locked all its job rows, two completions that finish
# members of the same workflows lock those workflow rows in the same order: no deadlock between
# them (members of several batches interleaved by id used to deadlock the completers).

import importlib

from django.db import migrations

COUNT_FUNCTIONS = r"""
-- Apply a delta [pending, done, dead, cancelled, reopened] to a workflow row and settle the
-- workflow when no member is pending.
CREATE OR REPLACE FUNCTION leasequeue_workflow_count(p_workflow bigint, p_delta jsonb, p_now timestamptz,
                                                     p_channel text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    v_pending integer;
BEGIN
    UPDATE leasequeue_workflow w
    SET members_pending = w.members_pending + (p_delta->>0)::int,
        members_done = w.members_done + (p_delta->>1)::int,
        members_dead = w.members_dead + (p_delta->>2)::int,
        members_cancelled = w.members_cancelled + (p_delta->>3)::int,
        progressed_at = p_now,
        finished_at = CASE WHEN (p_delta->>4)::int > 0 THEN NULL ELSE w.finished_at END
    WHERE w.id = p_workflow
    RETURNING w.members_pending INTO v_pending;
    IF v_pending = 0 THEN
        PERFORM leasequeue_workflow_settle(p_workflow, p_now, p_channel);
    END IF;
END
$fn$;

-- Apply every delta this transaction has gathered, in workflow id order, and clear them first.
CREATE OR REPLACE FUNCTION leasequeue_workflow_flush(p_now timestamptz, p_channel text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    v_acc text := nullif(current_setting('leasequeue.workflow_delta', true), '');
    r record;
BEGIN
    IF v_acc IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('leasequeue.workflow_delta', '', true);
    FOR r IN SELECT d.key::bigint AS workflow, d.value FROM jsonb_each(v_acc::jsonb) AS d ORDER BY 1 LOOP
        PERFORM leasequeue_workflow_count(r.workflow, r.value, coalesce(p_now, leasequeue_now()), p_channel);
    END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION leasequeue_job_settled() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    -- Read when needed: a member without dependents only adds to the delta.
    v_now timestamptz;
    v_channel text;
    v_old text := CASE WHEN OLD.status IN ('done', 'dead', 'cancelled') THEN OLD.status ELSE 'pending' END;
    v_new text := CASE WHEN NEW.status IN ('done', 'dead', 'cancelled') THEN NEW.status ELSE 'pending' END;
    v_pending integer;
    v_map jsonb;
    v_key text;
    v_cur jsonb;
    v_released bigint[];
    r record;
BEGIN
    IF v_old = v_new THEN
        RETURN NULL;
    END IF;
    IF NEW.has_dependents AND v_new <> 'pending' THEN
        v_now := leasequeue_now();
        v_channel := nullif(current_setting('leasequeue.notify_channel', true), '');
        -- The release, in two statements. The first one resolves the edges and counts the
        -- dependents down; it may wait for another transaction's lock on a dependent (its other
        -- dependency finishing at the same moment), and then works on the row that transaction
        -- committed, but its subqueries still read the snapshot taken before the wait. So the
        -- results are read by a second statement, whose snapshot is taken after it: a dependency
        -- committed by the transaction waited for is seen as done, with its result.
        v_released := '{}';
        FOR r IN
            WITH settled AS (
                UPDATE leasequeue_dependency d SET resolved = true
                FROM leasequeue_job dj
                WHERE d.depends_on_id = NEW.id AND NOT d.resolved AND dj.id = d.job_id
                  AND (v_new = 'done' OR dj.on_dependency_dead = 'run')
                RETURNING d.job_id
            ),
            locked AS (
                -- FOR UPDATE returns the latest committed version of a row it waited for.
                SELECT j.id, (j.status = 'waiting' AND j.waiting_on <= 1) AS releasing
                FROM leasequeue_job j JOIN settled s ON s.job_id = j.id
                FOR UPDATE OF j
            )
            UPDATE leasequeue_job j
            SET waiting_on = greatest(j.waiting_on - 1, 0),
                status = CASE WHEN l.releasing THEN 'ready' ELSE j.status END,
                run_at = CASE WHEN l.releasing THEN greatest(j.run_at, v_now) ELSE j.run_at END
            FROM locked l
            WHERE j.id = l.id
            RETURNING j.id, j.queue, j.run_at, l.releasing, j.pass_result
        LOOP
            IF r.releasing THEN
                IF r.pass_result THEN
                    v_released := v_released || r.id;
                END IF;
                PERFORM leasequeue_wake(v_channel, r.queue, r.run_at, v_now);
            END IF;
        END LOOP;
        IF cardinality(v_released) > 0 THEN
            UPDATE leasequeue_job j
            SET args = jsonb_build_array((
                    SELECT CASE WHEN count(*) = 1
                                THEN (array_agg(CASE WHEN p.status = 'done' THEN p.result END))[1]
                                ELSE jsonb_object_agg(e.name, CASE WHEN p.status = 'done' THEN p.result END)
                           END
                    FROM leasequeue_dependency e JOIN leasequeue_job p ON p.id = e.depends_on_id
                    WHERE e.job_id = j.id)) || j.args
            WHERE j.id = ANY(v_released);
        END IF;
        IF v_new <> 'done' THEN
            WITH RECURSIVE doomed(id) AS (
                SELECT d.job_id FROM leasequeue_dependency d JOIN leasequeue_job j ON j.id = d.job_id
                WHERE d.depends_on_id = NEW.id AND NOT d.resolved
                  AND j.on_dependency_dead = 'cancel' AND j.status = 'waiting'
                UNION
                SELECT d.job_id FROM doomed x
                JOIN leasequeue_dependency d ON d.depends_on_id = x.id
                JOIN leasequeue_job j ON j.id = d.job_id
                WHERE NOT d.resolved AND j.on_dependency_dead = 'cancel' AND j.status = 'waiting'
            )
            UPDATE leasequeue_job j
            SET status = 'cancelled', finished_at = v_now,
                history = j.history || jsonb_build_array(jsonb_build_object(
                    'event', 'cancelled', 'by', 'dependency #' || NEW.id, 'at', v_now,
                    'reason', 'dependency #' || NEW.id || ' ended ' || NEW.status))
            WHERE j.id IN (SELECT id FROM doomed) AND j.status = 'waiting';
        END IF;
    END IF;
    IF NEW.workflow_id IS NOT NULL THEN
        IF NEW.workflow_role = 'member' THEN
            -- Count the move into this transaction's running delta of its workflow.
            v_map := coalesce(nullif(current_setting('leasequeue.workflow_delta', true), '')::jsonb, '{}'::jsonb);
            v_key := NEW.workflow_id::text;
            v_cur := coalesce(v_map -> v_key, '[0, 0, 0, 0, 0]'::jsonb);
            v_map := v_map || jsonb_build_object(v_key, jsonb_build_array(
                (v_cur->>0)::int + (v_new = 'pending')::int - (v_old = 'pending')::int,
                (v_cur->>1)::int + (v_new = 'done')::int - (v_old = 'done')::int,
                (v_cur->>2)::int + (v_new = 'dead')::int - (v_old = 'dead')::int,
                (v_cur->>3)::int + (v_new = 'cancelled')::int - (v_old = 'cancelled')::int,
                greatest((v_cur->>4)::int, (v_new = 'pending')::int)));
            PERFORM set_config('leasequeue.workflow_delta', v_map::text, true);
        ELSE
            -- A callback: the counters it reads must hold every member counted so far.
            v_now := coalesce(v_now, leasequeue_now());
            v_channel := nullif(current_setting('leasequeue.notify_channel', true), '');
            PERFORM leasequeue_workflow_flush(v_now, v_channel);
            UPDATE leasequeue_workflow w
            SET progressed_at = v_now,
                finished_at = CASE WHEN v_new = 'pending' THEN NULL ELSE w.finished_at END
            WHERE w.id = NEW.workflow_id
            RETURNING w.members_pending INTO v_pending;
            IF v_new <> 'pending' AND v_pending = 0 THEN
                PERFORM leasequeue_workflow_settle(NEW.workflow_id, v_now, v_channel);
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE OR REPLACE FUNCTION leasequeue_job_settled_flush() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF nullif(current_setting('leasequeue.workflow_delta', true), '') IS NOT NULL THEN
        PERFORM leasequeue_workflow_flush(NULL, nullif(current_setting('leasequeue.notify_channel', true), ''));
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER leasequeue_job_settled_flush
AFTER UPDATE OF status ON leasequeue_job
FOR EACH STATEMENT
EXECUTE FUNCTION leasequeue_job_settled_flush();
"""


def _settled_before() -> str:
    """The row trigger's function as 0012_workflow_release_snapshot left it (restored on the way back)."""
    module = importlib.import_module("django_leasequeue.migrations.0012_workflow_release_snapshot")
    return str(module.JOB_SETTLED)


DROP_COUNT_FUNCTIONS = """
DROP TRIGGER IF EXISTS leasequeue_job_settled_flush ON leasequeue_job;
DROP FUNCTION IF EXISTS leasequeue_job_settled_flush();
""" + _settled_before() + """
DROP FUNCTION IF EXISTS leasequeue_workflow_flush(timestamptz, text);
DROP FUNCTION IF EXISTS leasequeue_workflow_count(bigint, jsonb, timestamptz, text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('django_leasequeue', '0013_workflow_monitoring'),
    ]

    operations = [
        migrations.RunSQL(COUNT_FUNCTIONS, DROP_COUNT_FUNCTIONS),
    ]
