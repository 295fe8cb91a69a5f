# The release of a job's dependents reads their dependencies' results in a statement of its own.
#
# Before, one statement counted a dependent down, released it and prepended its dependencies'
# results. When a dependent's last two dependencies finished at the same moment in two
# transactions, the second one's statement waited for the first one's lock on the dependent and
# then released it (the count was right: the row it works on is the one committed), but read the
# results through its snapshot from before the wait, so the first dependency's result was passed as
# null. The release now counts down in one statement and reads the results in the next one, whose
# snapshot includes the transaction it waited for.
#
# Only leasequeue_job_settled() is replaced; the trigger, the other functions and the schema stay.
# The reverse keeps the new function: it works on the schema of 0011 as it is.

from django.db import migrations

JOB_SETTLED = r"""
CREATE OR REPLACE FUNCTION leasequeue_job_settled() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := leasequeue_now();
    v_channel text := nullif(current_setting('leasequeue.notify_channel', true), '');
    v_old text := CASE WHEN OLD.status IN ('done', 'dead', 'cancelled') THEN OLD.status ELSE 'pending' END;
    v_new text := CASE WHEN NEW.status IN ('done', 'dead', 'cancelled') THEN NEW.status ELSE 'pending' END;
    v_pending integer;
    v_released bigint[];
    r record;
BEGIN
    IF v_old = v_new THEN
        RETURN NULL;
    END IF;
    IF NEW.has_dependents AND v_new <> 'pending' THEN
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
            UPDATE leasequeue_workflow w
            SET members_pending = w.members_pending + (v_new = 'pending')::int - (v_old = 'pending')::int,
                members_done = w.members_done + (v_new = 'done')::int - (v_old = 'done')::int,
                members_dead = w.members_dead + (v_new = 'dead')::int - (v_old = 'dead')::int,
                members_cancelled = w.members_cancelled + (v_new = 'cancelled')::int - (v_old = 'cancelled')::int,
                progressed_at = v_now,
                finished_at = CASE WHEN v_new = 'pending' THEN NULL ELSE w.finished_at END
            WHERE w.id = NEW.workflow_id
            RETURNING w.members_pending INTO v_pending;
            IF v_pending = 0 THEN
                PERFORM leasequeue_workflow_settle(NEW.workflow_id, v_now, v_channel);
            END IF;
        ELSE
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
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0011_workflows"),
    ]

    operations = [
        migrations.RunSQL(JOB_SETTLED, reverse_sql=migrations.RunSQL.noop),
    ]
