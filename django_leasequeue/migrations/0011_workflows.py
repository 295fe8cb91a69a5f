# Workflows and batches: the workflow table, dependency edges, the job's workflow columns and its
# "waiting" state, and the settle trigger that resolves dependencies in the transaction that
# finishes a job.
#
# The new job columns are nullable or have a database default (no table rewrite). Re-creating the
# status check and the active unique-key index reads the job table once: migrate in a quiet moment
# on a large table.

import django.db.models.deletion
from django.db import migrations, models

# The settle trigger: dependencies resolve with the completion (docs/explanation/workflows.md).
#
# leasequeue_job_settled() runs AFTER an UPDATE of a job's status, for jobs in a workflow or with
# dependents only (the trigger's WHEN clause, evaluated without a function call for every other
# job), and only when the job enters or leaves a finished state (done, dead, cancelled): claims,
# releases and retries between ready, leased and waiting never call it. Because it is a trigger it
# runs in the same transaction as the write that finished the job, whichever path wrote it: the
# worker's batched completion (one flush, one transaction), fenced_atomic(), a failure, the reaper,
# an operator's cancel or replay. A worker SIGKILLed before that commit finished nothing and
# released nothing; after it, both are durable.
#
# 1. Edges. When the job ends done, every unresolved edge from it is resolved; when it ends dead or
#    cancelled, only the edges of dependents whose policy is "run". A resolved edge is never
#    resolved again, so a replayed dependency that later succeeds cannot count twice. The dependent
#    whose last edge this was goes from waiting to ready (due at once, or at its own later run_at),
#    with its dependencies' results prepended to its args when it asked for them (pass_result: the
#    one result, or an object step name -> result for several; null for a failed dependency).
#    Dependents whose policy is "cancel", and theirs, transitively, are cancelled in one statement
#    (a recursive query, not trigger recursion: a long chain must not exhaust the stack).
# 2. Counters. A member moving into or out of a finished state moves the workflow's counters, in
#    an UPDATE of the workflow row: concurrent completions of one workflow's members queue on that
#    row lock, so exactly one of them sees members_pending reach 0 and settles the workflow.
#
# Released jobs NOTIFY the channel in the transaction-local setting leasequeue.notify_channel (set
# by the statements that can finish a job, store._db.CLOCK_WAKING, when the NOTIFY setting is on),
# delivered at commit, so an idle worker starts the next step at once instead of at its next poll.
WORKFLOW_FUNCTIONS = r"""
CREATE OR REPLACE FUNCTION leasequeue_wake(p_channel text, p_queue text, p_run_at timestamptz, p_now timestamptz)
RETURNS void LANGUAGE sql AS $fn$
    SELECT CASE WHEN p_channel IS NULL THEN NULL
                WHEN p_run_at <= p_now THEN pg_notify(p_channel, p_queue)
                ELSE pg_notify(p_channel, p_queue || ' ' || extract(epoch FROM p_run_at)::text) END;
$fn$;

-- Settle a closed workflow with no pending member: release on_complete; release on_success when
-- every member is done (or the workflow's policy is "run"), cancel it when the policy is "cancel",
-- else leave it waiting until the failed members are replayed and done; mark the workflow finished
-- when no callback is pending. The caller holds the workflow row's lock (it just updated it).
CREATE OR REPLACE FUNCTION leasequeue_workflow_settle(p_workflow bigint, p_now timestamptz, p_channel text)
RETURNS void LANGUAGE plpgsql AS $fn$
DECLARE
    w leasequeue_workflow%ROWTYPE;
    r record;
BEGIN
    SELECT * INTO w FROM leasequeue_workflow WHERE id = p_workflow;
    IF NOT FOUND OR w.closed_at IS NULL OR w.members_pending > 0 THEN
        RETURN;
    END IF;
    FOR r IN
        UPDATE leasequeue_job j
        SET status = 'ready', run_at = greatest(j.run_at, p_now),
            args = CASE WHEN j.pass_result THEN jsonb_build_array((
                       SELECT coalesce(jsonb_agg(m.result ORDER BY m.id), '[]'::jsonb) FROM leasequeue_job m
                       WHERE m.workflow_id = p_workflow AND m.workflow_role = 'member')) || j.args
                   ELSE j.args END
        WHERE j.status = 'waiting' AND (
            j.id = w.on_complete_id
            OR (j.id = w.on_success_id AND (w.members_done = w.members OR w.on_dependency_dead = 'run')))
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

CREATE OR REPLACE FUNCTION leasequeue_job_settled() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    v_now timestamptz := leasequeue_now();
    v_channel text := nullif(current_setting('leasequeue.notify_channel', true), '');
    v_old text := CASE WHEN OLD.status IN ('done', 'dead', 'cancelled') THEN OLD.status ELSE 'pending' END;
    v_new text := CASE WHEN NEW.status IN ('done', 'dead', 'cancelled') THEN NEW.status ELSE 'pending' END;
    v_pending integer;
    r record;
BEGIN
    IF v_old = v_new THEN
        RETURN NULL;
    END IF;
    IF NEW.has_dependents AND v_new <> 'pending' THEN
        FOR r IN
            WITH settled AS (
                UPDATE leasequeue_dependency d SET resolved = true
                FROM leasequeue_job dj
                WHERE d.depends_on_id = NEW.id AND NOT d.resolved AND dj.id = d.job_id
                  AND (v_new = 'done' OR dj.on_dependency_dead = 'run')
                RETURNING d.job_id
            )
            UPDATE leasequeue_job j
            SET waiting_on = greatest(j.waiting_on - 1, 0),
                status = CASE WHEN j.status = 'waiting' AND j.waiting_on <= 1 THEN 'ready' ELSE j.status END,
                run_at = CASE WHEN j.status = 'waiting' AND j.waiting_on <= 1 THEN greatest(j.run_at, v_now)
                              ELSE j.run_at END,
                args = CASE WHEN j.status = 'waiting' AND j.waiting_on <= 1 AND j.pass_result THEN
                           jsonb_build_array((
                               SELECT CASE WHEN count(*) = 1
                                           THEN (array_agg(CASE WHEN p.status = 'done' THEN p.result END))[1]
                                           ELSE jsonb_object_agg(e.name, CASE WHEN p.status = 'done' THEN p.result END)
                                      END
                               FROM leasequeue_dependency e JOIN leasequeue_job p ON p.id = e.depends_on_id
                               WHERE e.job_id = j.id)) || j.args
                       ELSE j.args END
            FROM settled s
            WHERE j.id = s.job_id
            RETURNING j.queue, j.run_at, j.status
        LOOP
            IF r.status = 'ready' THEN
                PERFORM leasequeue_wake(v_channel, r.queue, r.run_at, v_now);
            END IF;
        END LOOP;
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

CREATE TRIGGER leasequeue_job_settled
AFTER UPDATE OF status ON leasequeue_job
FOR EACH ROW
WHEN ((NEW.workflow_id IS NOT NULL OR NEW.has_dependents)
      AND OLD.status IS DISTINCT FROM NEW.status
      AND (OLD.status IN ('done', 'dead', 'cancelled') OR NEW.status IN ('done', 'dead', 'cancelled')))
EXECUTE FUNCTION leasequeue_job_settled();
"""

DROP_WORKFLOW_FUNCTIONS = """
DROP TRIGGER IF EXISTS leasequeue_job_settled ON leasequeue_job;
DROP FUNCTION IF EXISTS leasequeue_job_settled();
DROP FUNCTION IF EXISTS leasequeue_workflow_settle(bigint, timestamptz, text);
DROP FUNCTION IF EXISTS leasequeue_wake(text, text, timestamptz, timestamptz);
"""



class Migration(migrations.Migration):

    dependencies = [
        ('django_leasequeue', '0010_rate_keys_fair'),
    ]

    operations = [
        migrations.CreateModel(
            name='Dependency',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('name', models.CharField(max_length=255)),
                ('resolved', models.BooleanField(default=False)),
            ],
            options={
                'db_table': 'leasequeue_dependency',
            },
        ),
        migrations.CreateModel(
            name='Workflow',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('chain', 'chain'), ('group', 'group'), ('chord', 'chord'), ('batch', 'batch'), ('graph', 'dependency graph')], max_length=10)),
                ('name', models.CharField(blank=True, default='', max_length=255)),
                ('unique_key', models.CharField(blank=True, help_text='building a workflow with a taken key returns the existing one', max_length=255, null=True)),
                ('on_dependency_dead', models.CharField(choices=[('hold', 'hold: wait until the dependency is replayed'), ('cancel', 'cancel this job (and its dependents that cancel too)'), ('run', 'run anyway, with the failure passed in')], default='hold', help_text='default policy of its steps and of its on_success callback', max_length=6)),
                ('created_at', models.DateTimeField()),
                ('closed_at', models.DateTimeField(blank=True, help_text='null: an open batch (members may be added)', null=True)),
                ('progressed_at', models.DateTimeField(help_text='last member settled, added or replayed')),
                ('finished_at', models.DateTimeField(blank=True, help_text='closed, no member pending, no callback pending', null=True)),
                ('members', models.PositiveIntegerField(default=0)),
                ('members_pending', models.PositiveIntegerField(default=0, help_text='waiting, ready or leased')),
                ('members_done', models.PositiveIntegerField(default=0)),
                ('members_dead', models.PositiveIntegerField(default=0)),
                ('members_cancelled', models.PositiveIntegerField(default=0)),
            ],
            options={
                'db_table': 'leasequeue_workflow',
                'ordering': ['-id'],
            },
        ),
        migrations.RemoveConstraint(
            model_name='job',
            name='leasequeue_job_unique_active',
        ),
        migrations.RemoveConstraint(
            model_name='job',
            name='leasequeue_job_status_valid',
        ),
        migrations.AddField(
            model_name='job',
            name='has_dependents',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddField(
            model_name='job',
            name='on_dependency_dead',
            field=models.CharField(choices=[('hold', 'hold: wait until the dependency is replayed'), ('cancel', 'cancel this job (and its dependents that cancel too)'), ('run', 'run anyway, with the failure passed in')], db_default='hold', default='hold', help_text='when a dependency is dead: hold, cancel or run', max_length=6),
        ),
        migrations.AddField(
            model_name='job',
            name='pass_result',
            field=models.BooleanField(db_default=False, default=False, help_text="on release, the dependencies' results are prepended to args"),
        ),
        migrations.AddField(
            model_name='job',
            name='waiting_on',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text='dependencies not settled yet (waiting until 0)'),
        ),
        migrations.AddField(
            model_name='job',
            name='workflow_role',
            field=models.CharField(blank=True, choices=[('member', 'member'), ('on_success', 'on_success callback'), ('on_complete', 'on_complete callback')], max_length=12, null=True),
        ),
        migrations.AddField(
            model_name='job',
            name='workflow_step',
            field=models.CharField(blank=True, help_text='step name in its workflow', max_length=255, null=True),
        ),
        migrations.AlterField(
            model_name='job',
            name='status',
            field=models.CharField(choices=[('ready', 'ready'), ('waiting', 'waiting'), ('leased', 'leased'), ('done', 'done'), ('dead', 'dead'), ('cancelled', 'cancelled')], default='ready', max_length=10),
        ),
        migrations.AddField(
            model_name='dependency',
            name='depends_on',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='dependent_edges', to='django_leasequeue.job'),
        ),
        migrations.AddField(
            model_name='dependency',
            name='job',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='dependency_edges', to='django_leasequeue.job'),
        ),
        migrations.AddField(
            model_name='workflow',
            name='on_complete',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='django_leasequeue.job'),
        ),
        migrations.AddField(
            model_name='workflow',
            name='on_success',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='django_leasequeue.job'),
        ),
        migrations.AddField(
            model_name='job',
            name='workflow',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='jobs', to='django_leasequeue.workflow'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('workflow__isnull', False)), fields=['workflow', 'id'], name='leasequeue_job_workflow'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.UniqueConstraint(condition=models.Q(('status__in', ['ready', 'waiting', 'leased']), ('unique_key__isnull', False), ('unique_scope', 'active')), fields=('unique_key',), name='leasequeue_job_unique_active'),
        ),
        migrations.AddConstraint(
            model_name='job',
            constraint=models.CheckConstraint(condition=models.Q(('status__in', ['ready', 'waiting', 'leased', 'done', 'dead', 'cancelled'])), name='leasequeue_job_status_valid'),
        ),
        migrations.AddIndex(
            model_name='dependency',
            index=models.Index(fields=['depends_on'], name='leasequeue_dependency_from'),
        ),
        migrations.AddConstraint(
            model_name='dependency',
            constraint=models.UniqueConstraint(fields=('job', 'depends_on'), name='leasequeue_dependency_edge'),
        ),
        migrations.AddIndex(
            model_name='workflow',
            index=models.Index(condition=models.Q(('finished_at__isnull', True)), fields=['progressed_at'], name='leasequeue_workflow_active'),
        ),
        migrations.AddConstraint(
            model_name='workflow',
            constraint=models.UniqueConstraint(condition=models.Q(('unique_key__isnull', False)), fields=('unique_key',), name='leasequeue_workflow_unique'),
        ),
        migrations.RunSQL(WORKFLOW_FUNCTIONS, DROP_WORKFLOW_FUNCTIONS),
    ]
