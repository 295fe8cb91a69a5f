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
-- Dead-letter jobs about to be released whose dependencies' results are too large to put into
-- their arguments: over 64 MiB as JSON text (PostgreSQL refuses a jsonb array over 255 MiB, a
-- value over 1 GB, and a worker would have to load it all). They end dead with the reason, which
-- an operator sees in the admin, instead of failing the statement that finished their last
-- dependency; their own dependents follow their policy, as any dead job's do.
CREATE OR REPLACE FUNCTION leasequeue_results_too_large(p_ids bigint[], p_from text, p_by text, p_now timestamptz)
RETURNS void LANGUAGE sql AS $fn$
    UPDATE leasequeue_job j
    SET status = 'dead', finished_at = p_now, leased_until = NULL,
        errors = CASE WHEN jsonb_typeof(j.errors) = 'array' THEN j.errors ELSE '[]'::jsonb END
                 || jsonb_build_array(jsonb_build_object(
                     'attempt', j.attempts, 'type', 'django_leasequeue.exceptions.PayloadTooLarge',
                     'message', 'the results of ' || p_from || ' are over 64 MiB as JSON, too large to '
                                || 'pass in the arguments: build this step with .set(pass_result=False) '
                                || 'and read them in the handler (WorkflowHandle(ctx.workflow_id())'
                                || '.results(), ctx.dependencies())',
                     'traceback', '', 'worker', p_by, 'at', p_now))
    WHERE j.id = ANY(p_ids) AND j.status IN ('waiting', 'ready');
$fn$;

-- Settle a closed workflow with no pending member (migration 0011's, with one change): when the
-- members' results are too large to pass to a callback that takes them, that callback ends dead
-- with the reason (leasequeue_results_too_large) instead of failing the statement that finished
-- the last member, which would keep that member from finishing at all (and, from the reaper's
-- sweep, every other expired lease with it). Checked before the release, not caught as an
-- error: an exception block would open a subtransaction per settle, and a completion that
-- settles many workflows at once would overflow the backend's subtransaction cache.
CREATE OR REPLACE FUNCTION leasequeue_workflow_settle(p_workflow bigint, p_now timestamptz, p_channel text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    w leasequeue_workflow%ROWTYPE;
    r record;
    v_due bigint[];
BEGIN
    SELECT * INTO w FROM leasequeue_workflow WHERE id = p_workflow;
    IF NOT FOUND OR w.closed_at IS NULL OR w.members_pending > 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg(j.id), '{}') INTO v_due FROM leasequeue_job j
    WHERE j.status = 'waiting' AND (
        j.id = w.on_complete_id
        OR (j.id = w.on_success_id AND (w.members_done = w.members OR w.on_dependency_dead = 'run')));
    IF EXISTS (SELECT 1 FROM leasequeue_job j WHERE j.id = ANY(v_due) AND j.pass_result)
       AND (SELECT coalesce(sum(octet_length(m.result::text)), 0) FROM leasequeue_job m
            WHERE m.workflow_id = p_workflow AND m.workflow_role = 'member') > 67108864 THEN
        PERFORM leasequeue_results_too_large(
            ARRAY(SELECT j.id FROM leasequeue_job j WHERE j.id = ANY(v_due) AND j.pass_result),
            'the workflow''s members', 'workflow #' || p_workflow, p_now);
    END IF;
    FOR r IN
        UPDATE leasequeue_job j
        SET status = 'ready', run_at = greatest(j.run_at, p_now),
            args = CASE WHEN j.pass_result THEN jsonb_build_array((
                       SELECT coalesce(jsonb_agg(m.result ORDER BY m.id), '[]'::jsonb) FROM leasequeue_job m
                       WHERE m.workflow_id = p_workflow AND m.workflow_role = 'member')) || j.args
                   ELSE j.args END
        WHERE j.id = ANY(v_due) AND j.status = 'waiting'
        RETURNING j.queue, j.run_at
    LOOP
        PERFORM leasequeue_wake(p_channel, r.queue, r.run_at, p_now);
    END LOOP;
    IF w.members_done < w.members AND w.on_dependency_dead = 'cancel' THEN
        UPDATE leasequeue_job j
        SET status = 'cancelled', finished_at = p_now,
            history = j.history || jsonb_build_array(jsonb_build_object(
                'event', 'cancelled', 'by', 'workflow #' || p_workflow, 'at', p_now,
                'reason', 'a member ended dead or cancelled'))
        WHERE j.id = w.on_success_id AND j.status = 'waiting';
    END IF;
    UPDATE leasequeue_workflow x SET finished_at = p_now
    WHERE x.id = p_workflow AND x.finished_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM leasequeue_job c WHERE c.id IN (w.on_success_id, w.on_complete_id)
                      AND c.status IN ('waiting', 'ready', 'leased'));
END
$fn$;

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
    v_big bigint[];
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
            -- Results that would not fit in the arguments (over 64 MiB as JSON text, the limit of
            -- leasequeue_results_too_large) dead-letter the released job with the reason instead
            -- of failing this statement, which would keep the job finishing here from finishing.
            SELECT coalesce(array_agg(x.id), '{}') INTO v_big FROM (
                SELECT e.job_id AS id FROM leasequeue_dependency e JOIN leasequeue_job p ON p.id = e.depends_on_id
                WHERE e.job_id = ANY(v_released) GROUP BY e.job_id
                HAVING sum(octet_length(p.result::text)) > 67108864) AS x;
            IF cardinality(v_big) > 0 THEN
                PERFORM leasequeue_results_too_large(v_big, 'its dependencies', 'job #' || NEW.id, v_now);
            END IF;
            UPDATE leasequeue_job j
            SET args = jsonb_build_array((
                    SELECT CASE WHEN count(*) = 1
                                THEN (array_agg(CASE WHEN p.status = 'done' THEN p.result END))[1]
                                ELSE jsonb_object_agg(e.name, CASE WHEN p.status = 'done' THEN p.result END)
                           END
                    FROM leasequeue_dependency e JOIN leasequeue_job p ON p.id = e.depends_on_id
                    WHERE e.job_id = j.id)) || j.args
            WHERE j.id = ANY(v_released) AND NOT j.id = ANY(v_big);
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


def _settle_before() -> str:
    """leasequeue_workflow_settle() as migration 0011 installed it (restored on the way back)."""
    module = importlib.import_module("django_leasequeue.migrations.0011_workflows")
    text = str(module.WORKFLOW_FUNCTIONS)
    start = text.index("CREATE OR REPLACE FUNCTION leasequeue_workflow_settle(")
    return text[start:text.index("CREATE OR REPLACE FUNCTION leasequeue_job_settled()")]


DROP_COUNT_FUNCTIONS = """
DROP TRIGGER IF EXISTS leasequeue_job_settled_flush ON leasequeue_job;
DROP FUNCTION IF EXISTS leasequeue_job_settled_flush();
""" + _settled_before() + _settle_before() + """
DROP FUNCTION IF EXISTS leasequeue_results_too_large(bigint[], text, text, timestamptz);
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
