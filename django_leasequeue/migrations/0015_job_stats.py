# Job outcome counters for the console's charts (leasequeue_job_stat), and the durable scheduler tick.
#
# The charts must never scan the job table on a page view, so outcomes are counted as they happen:
# a statement-level AFTER UPDATE trigger reads the statement's transition tables (the rows before
# and after) and adds, per minute, queue and task, the claims (with their wait from due to claim),
# completions (with their run time from claim to done), retried failures, dead letters and
# cancellations, each in the minute of the statement that made it (by that statement's clock,
# injected or not: the claim's attempted_at, the finish's finished_at, a retried failure's error
# "at"). One trigger covers every path that moves a job: claims, the completer's batched
# completions, fenced_atomic() commits, failures, the reaper, the operator's cancels; a replay
# moves a job from dead to ready and so changes no past count (the dead-letter rate of the last
# hour stays what it was).
#
# Why a statement trigger and a row per writer: one INSERT ... ON CONFLICT per statement adds up
# the whole batch (a completion of 100 jobs is one upsert per queue and task, not 100), and each
# connection writes its own row (shard = pg_backend_pid()), so two workers completing jobs of the
# same task never wait on each other's counter row. The reaper folds the shards into shard 0 once
# their minute is past and rolls minute rows into hour rows and hour rows into day rows
# (store.stats). A transition table cannot be declared with a column list (UPDATE OF status), so
# the trigger fires on every UPDATE of the job table, renewals included; those join to no status
# change and insert nothing.
#
# Histograms are bigint[15] arrays: element i + 1 counts the values whose width_bucket over the
# bounds below (which must equal models.STAT_BOUNDS) is i. They are added element by element in
# plain expressions, generated below: no function call, no set-returning function per row.
#
# Cost: the trigger runs once per UPDATE statement of the job table. It leaves at once when no job
# moved (renewals). It runs with jit = off, because the planner cannot know the transition tables'
# sizes and its estimate crossed jit_above_cost, so every call paid a JIT compilation of several
# milliseconds. bench/stats_bench.py measures the drain with the trigger on and off.

from django.db import migrations, models

from django_leasequeue.stat_models import HistogramField

BOUNDS = "'{0.01,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,300,900,3600}'::float8[]"
SLOTS = range(15)  # width_bucket's results over BOUNDS: 0 .. 14


def counts(column: str) -> str:
    """ARRAY[count of rows whose bucket column is 0, ..., is 14]."""
    return "ARRAY[" + ", ".join(f"count(*) FILTER (WHERE {column} = {i})" for i in SLOTS) + "]::bigint[]"


def added(column: str) -> str:
    """The upsert's element-by-element sum of the stored and the new histogram."""
    return "ARRAY[" + ", ".join(f"s.{column}[{i + 1}] + EXCLUDED.{column}[{i + 1}]" for i in SLOTS) + "]::bigint[]"


STAT_SQL = r"""
-- The timestamp a failure's error entry carries, or NULL when it is not one (a hand-written entry):
-- the trigger must never make a job's UPDATE fail, so a value that does not parse is no time.
CREATE OR REPLACE FUNCTION leasequeue_stat_time(v text) RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $fn$
BEGIN
    RETURN v::timestamptz;
EXCEPTION WHEN others THEN
    RETURN NULL;
END;
$fn$;

-- The settings: plpgsql keeps a generic plan once a session has run the statement a few times,
-- planned for transition tables of the sizes it saw (one row: a renewal, a completion); reused on
-- a statement of 20,000 rows (a bulk cancel), its nested loop joined every old row to every new
-- one and took 133 s. Hash joins cost the same on one row and stay linear. A large custom plan
-- (a session's first statements) crosses jit_above_cost, and compiling it took about a second.
CREATE OR REPLACE FUNCTION leasequeue_job_stat_count() RETURNS trigger
LANGUAGE plpgsql
SET enable_nestloop = off
SET jit = off
AS $fn$
BEGIN
    -- Most UPDATEs of the job table move no job (renewals, notes): leave at once.
    IF NOT EXISTS (SELECT 1 FROM leasequeue_stat_new n JOIN leasequeue_stat_old o ON o.id = n.id
                   WHERE o.status IS DISTINCT FROM n.status) THEN
        RETURN NULL;
    END IF;
    WITH moved AS (
        SELECT n.queue, n.task,
               CASE WHEN n.status = 'leased' AND o.status = 'ready' THEN 'started'
                    WHEN n.status = 'done' THEN 'done'
                    WHEN n.status = 'dead' THEN 'dead'
                    WHEN n.status = 'cancelled' THEN 'cancelled'
                    WHEN n.status = 'ready' AND o.status = 'leased'
                         AND CASE WHEN jsonb_typeof(n.errors) = 'array' THEN jsonb_array_length(n.errors) ELSE 0 END
                             > CASE WHEN jsonb_typeof(o.errors) = 'array' THEN jsonb_array_length(o.errors) ELSE 0 END
                    THEN 'failed'
               END AS kind,
               -- greatest() clips a negative span (two sessions' clock offsets) to 0, but it would
               -- also turn a missing time (NULL: a row written by hand) into 0 s: no time, no span.
               CASE WHEN n.status = 'leased' AND o.status = 'ready'
                         AND n.attempted_at IS NOT NULL AND o.run_at IS NOT NULL
                    THEN greatest(extract(epoch FROM n.attempted_at - o.run_at)::float8, 0) END AS wait,
               CASE WHEN n.status = 'done' AND o.status = 'leased'
                         AND n.finished_at IS NOT NULL AND o.attempted_at IS NOT NULL
                    THEN greatest(extract(epoch FROM n.finished_at - o.attempted_at)::float8, 0) END AS run,
               -- A retried failure has no time column of its own: its moment is the "at" of the
               -- error the failing statement just appended (that statement's clock, injected or not).
               date_trunc('minute', CASE WHEN n.status = 'leased' THEN n.attempted_at
                                         WHEN n.status IN ('done', 'dead', 'cancelled') THEN n.finished_at
                                         WHEN n.status = 'ready' AND o.status = 'leased'
                                              AND jsonb_typeof(n.errors) = 'array'
                                         THEN leasequeue_stat_time(n.errors -> -1 ->> 'at') END
                                    AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS at
        FROM leasequeue_stat_new n JOIN leasequeue_stat_old o ON o.id = n.id
        WHERE o.status IS DISTINCT FROM n.status
    ),
    events AS (
        SELECT queue, task, kind, wait, run,
               width_bucket(wait, {bounds}) AS wait_slot, width_bucket(run, {bounds}) AS run_slot,
               coalesce(at, date_trunc('minute', leasequeue_now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AS minute
        FROM moved WHERE kind IS NOT NULL
    )
    INSERT INTO leasequeue_job_stat AS s
        (bucket, span, queue, task, shard, started, done, failed, dead, cancelled, wait_sum, wait_hist, run_sum, run_hist)
    SELECT minute, 60, queue, task, pg_backend_pid(),
           count(*) FILTER (WHERE kind = 'started'), count(*) FILTER (WHERE kind = 'done'),
           count(*) FILTER (WHERE kind = 'failed'), count(*) FILTER (WHERE kind = 'dead'),
           count(*) FILTER (WHERE kind = 'cancelled'),
           coalesce(sum(wait), 0), {wait_counts}, coalesce(sum(run), 0), {run_counts}
    FROM events
    GROUP BY minute, queue, task
    -- Sorted, so that two statements of one backend (a trigger fired inside another) and the
    -- reaper's fold take the counter rows in the same order.
    ORDER BY minute, queue, task
    ON CONFLICT (span, bucket, queue, task, shard) DO UPDATE
    SET started = s.started + EXCLUDED.started, done = s.done + EXCLUDED.done,
        failed = s.failed + EXCLUDED.failed, dead = s.dead + EXCLUDED.dead,
        cancelled = s.cancelled + EXCLUDED.cancelled,
        wait_sum = s.wait_sum + EXCLUDED.wait_sum, wait_hist = {wait_added},
        run_sum = s.run_sum + EXCLUDED.run_sum, run_hist = {run_added};
    RETURN NULL;
END;
$fn$;

CREATE TRIGGER leasequeue_job_stat_count
AFTER UPDATE ON leasequeue_job
REFERENCING OLD TABLE AS leasequeue_stat_old NEW TABLE AS leasequeue_stat_new
FOR EACH STATEMENT
EXECUTE FUNCTION leasequeue_job_stat_count();
""".format(bounds=BOUNDS, wait_counts=counts("wait_slot"), run_counts=counts("run_slot"),
           wait_added=added("wait_hist"), run_added=added("run_hist"))

DROP_STAT_SQL = r"""
DROP TRIGGER IF EXISTS leasequeue_job_stat_count ON leasequeue_job;
DROP FUNCTION IF EXISTS leasequeue_job_stat_count();
DROP FUNCTION IF EXISTS leasequeue_stat_time(text);
"""


class Migration(migrations.Migration):

    dependencies = [
        ('django_leasequeue', '0014_workflow_counts'),
    ]

    operations = [
        migrations.AddField(
            model_name='reapersweep',
            name='scheduler_tick_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AlterModelOptions(
            name='workerprocess',
            options={'ordering': ['kind', 'id'], 'verbose_name': 'worker process',
                     'verbose_name_plural': 'worker processes'},
        ),
        migrations.AddField(
            model_name='workerprocess',
            name='reaps',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.CreateModel(
            name='JobStat',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('bucket', models.DateTimeField(help_text='start of the bucket (database time, UTC)')),
                ('span', models.PositiveIntegerField(help_text='bucket length in seconds: 60, 3600 or 86400')),
                ('queue', models.CharField(max_length=100)),
                ('task', models.CharField(max_length=255)),
                ('shard', models.IntegerField(default=0, help_text="the writer's backend pid; 0 once folded by the reaper")),
                ('started', models.BigIntegerField(default=0, help_text='claims (attempts started)')),
                ('done', models.BigIntegerField(default=0)),
                ('failed', models.BigIntegerField(default=0, help_text='failed attempts that will be retried')),
                ('dead', models.BigIntegerField(default=0, help_text='jobs dead-lettered')),
                ('cancelled', models.BigIntegerField(default=0)),
                ('wait_sum', models.FloatField(default=0.0, help_text='seconds from due to claim, summed over claims')),
                ('wait_hist', HistogramField()),
                ('run_sum', models.FloatField(default=0.0, help_text='seconds from claim to done, summed over done jobs')),
                ('run_hist', HistogramField()),
            ],
            options={
                'db_table': 'leasequeue_job_stat',
                'constraints': [models.UniqueConstraint(fields=('span', 'bucket', 'queue', 'task', 'shard'), name='leasequeue_job_stat_key')],
            },
        ),
        migrations.RunSQL(STAT_SQL, DROP_STAT_SQL),
        # The dead letters per queue, index-only (see models.Job.Meta.indexes).
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'dead')), fields=['queue', 'finished_at'],
                               name='leasequeue_job_dead'),
        ),
    ]
