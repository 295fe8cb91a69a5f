# Per-key rate limits and fair claiming: the job's rate key, limit and fair key, the per-key rate
# log table, the fair cursor of a queue, the index of the fair claim, and the admission function
# that enforces per-key rate limits inside the claim.
#
# The new job columns are nullable without a default (no table rewrite). The index
# leasequeue_job_fair is built with a plain CREATE INDEX, which blocks writes to the job table
# while it is built: on a large ready backlog, migrate in a quiet moment.

from django.db import migrations, models

# Called by the claim statements (store.JOB_CLAIM* and store.keys.JOB_CLAIM_FAIR) for each
# candidate job that has a rate key, after the concurrency admission and before FOR UPDATE SKIP
# LOCKED takes the row. It answers "may this claim take one more job of this key?" and serialises
# every claimer of a key:
#
# * It takes a transaction-scoped advisory lock on the key with pg_try_advisory_xact_lock (two-int
#   form, namespace 1279395154, one above the concurrency admission's). If another claim holds it,
#   the key is skipped for this claim, as SKIP LOCKED skips a locked row: no waiting, no deadlock.
# * Holding the lock, it reads the key's log row on a fresh snapshot (VOLATILE function under READ
#   COMMITTED, snapshot taken after the lock), so every claim of the key that committed before is
#   counted, and it adds this admission to the log at once (same bucket merging as the queue rate
#   log: entries in one 1/100 of the window share the latest time; a slot frees up to window/100
#   late, never early). Later admissions of the same key in the same claim read that update
#   (their own transaction's write).
# * Keys that are used up (or busy with another claimer) for the rest of the claim are listed in
#   the setting leasequeue.rate_closed ("<claim id>;<hashtext(key)>;..."), which the claim checks
#   inline with strpos() before calling this function: a backlog of one used-up key is skipped at
#   the cost of reading its rows, not a plpgsql call per row.
#
# The result is conservative, never over. A candidate another claim of the key leased since this
# statement's snapshot is seen as such (the fresh re-read of p_job) and not admitted. An admission
# whose row is then skipped by SKIP LOCKED (locked by something else than a claim of the key), or
# trimmed by the claim's outer LIMIT stays in the log, so
# a key may run fewer jobs than its limit in a window, never more. Keyless jobs never call it.
RATE_ADMIT_FUNCTION = """
CREATE OR REPLACE FUNCTION leasequeue_rate_admit(p_key text, p_n integer, p_secs double precision,
                                                 p_now timestamptz, p_claim text, p_job bigint)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    closed text := current_setting('leasequeue.rate_closed', true);
    now_s numeric := extract(epoch FROM p_now);
    secs numeric := p_secs::numeric;
    used integer;
BEGIN
    IF closed IS NULL OR split_part(closed, ';', 1) IS DISTINCT FROM p_claim THEN
        PERFORM set_config('leasequeue.rate_closed', p_claim || ';', true);
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'django-leasequeue: claiming jobs with a rate key needs READ COMMITTED '
                        'isolation (the fresh per-key count depends on it), not %',
                        current_setting('transaction_isolation');
    END IF;
    IF NOT pg_try_advisory_xact_lock(1279395154, hashtext(p_key)) THEN
        PERFORM set_config('leasequeue.rate_closed',
            current_setting('leasequeue.rate_closed', true) || hashtext(p_key)::text || ';', true);
        RETURN false;
    END IF;
    -- Holding the lock, re-read the candidate on a fresh snapshot: a claim of this key that
    -- committed after this statement's snapshot may have leased it already. Its row would then
    -- fail the re-check after FOR UPDATE, and an admission counted for it would be lost to the
    -- window (with several claimers of a key, most of its allowance).
    IF NOT EXISTS (SELECT 1 FROM leasequeue_job WHERE id = p_job AND status = 'ready') THEN
        RETURN false;
    END IF;
    -- One statement in the common case: count the window and, when it has room, log this
    -- admission (entries merged per 1/100 of the window under their latest time).
    UPDATE leasequeue_rate_key r
    SET log = (
            SELECT coalesce(jsonb_agg(jsonb_build_array(b.t, b.c) ORDER BY b.t), '[]'::jsonb)
            FROM (
                SELECT max(x.t) AS t, sum(x.c)::int AS c
                FROM (
                    SELECT (e->>0)::numeric AS t, (e->>1)::int AS c FROM jsonb_array_elements(r.log) AS e
                    WHERE (e->>0)::numeric >= now_s - secs
                    UNION ALL
                    SELECT now_s, 1
                ) AS x
                GROUP BY floor(x.t / (secs / 100))
            ) AS b),
        expires_at = greatest(r.expires_at, p_now + make_interval(secs => p_secs))
    FROM (SELECT r0.key, (SELECT coalesce(sum((e->>1)::int), 0) FROM jsonb_array_elements(r0.log) AS e
                          WHERE (e->>0)::numeric >= now_s - secs)::int AS n
          FROM leasequeue_rate_key r0 WHERE r0.key = p_key) AS w
    WHERE r.key = p_key AND w.key = r.key AND w.n < p_n
    RETURNING w.n INTO used;
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM leasequeue_rate_key r WHERE r.key = p_key) THEN
            -- The row is there and its window is full.
            PERFORM set_config('leasequeue.rate_closed',
                current_setting('leasequeue.rate_closed', true) || hashtext(p_key)::text || ';', true);
            RETURN false;
        END IF;
        -- First admission of the key (or its row was pruned); the advisory lock makes this the
        -- only inserter.
        INSERT INTO leasequeue_rate_key (key, log, expires_at)
        VALUES (p_key, jsonb_build_array(jsonb_build_array(now_s, 1)), p_now + make_interval(secs => p_secs));
        used := 0;
    END IF;
    IF used + 1 >= p_n THEN
        PERFORM set_config('leasequeue.rate_closed',
            current_setting('leasequeue.rate_closed', true) || hashtext(p_key)::text || ';', true);
    END IF;
    RETURN true;
END
$$;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0009_sequences"),
    ]

    operations = [
        migrations.CreateModel(
            name="RateKeyState",
            fields=[
                ("key", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("log", models.JSONField(blank=True, default=list, help_text="[[claim time as epoch seconds (database clock), jobs admitted], ...]")),
                ("expires_at", models.DateTimeField(help_text="when the latest logged claim leaves the window")),
            ],
            options={
                "db_table": "leasequeue_rate_key",
            },
        ),
        migrations.AddField(
            model_name="job",
            name="fair_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_key",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_limit_n",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_limit_secs",
            field=models.FloatField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="queuestate",
            name="fair_cursor",
            field=models.CharField(blank=True, help_text="fair queues: the fair key the latest claim served last (the next claim starts after it)", max_length=255, null=True),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(models.F("queue"), models.F("fair_key"), models.OrderBy(models.F("priority"), descending=True), models.F("run_at"), models.F("id"), condition=models.Q(("status", "ready")), name="leasequeue_job_fair"),
        ),
        migrations.RunSQL(
            RATE_ADMIT_FUNCTION,
            "DROP FUNCTION IF EXISTS leasequeue_rate_admit(text, integer, double precision, timestamptz, text, bigint);",
        ),
    ]
