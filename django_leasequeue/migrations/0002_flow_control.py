# Flow control: the per-queue rate-limit log and throttle counter on leasequeue_queue,
# and the admission function that enforces per-key concurrency limits inside the claim.

from django.db import migrations, models

# Called by the claim statements (store.JOB_CLAIM*) for each candidate job that has a concurrency
# key, inside the locked candidate scan (before FOR UPDATE SKIP LOCKED takes the row). It answers
# "may this claim lease one more job of this key?" and serialises every claimer of a key:
#
# * The first time a claim statement meets key K it counts K's leased jobs (index
#   leasequeue_job_conc_admit, below); a full key is rejected
#   there, without any lock. Otherwise it takes a transaction-scoped advisory lock on K with
#   pg_try_advisory_xact_lock (two-int form, namespace 1279395153, so application advisory locks
#   on one bigint never collide with ours). If another claim holds it, K is skipped for this claim,
#   exactly like SKIP LOCKED skips a locked row: no waiting, no deadlock, and the other claimer is
#   the one admitting K's jobs right now.
# * Holding the lock, it counts K's leased jobs again. The function is VOLATILE, so under READ
#   COMMITTED each count runs on a fresh snapshot; this one is taken after the lock was granted, so
#   every claim of K that committed before (and released the lock at commit, after its rows became
#   visible) is counted. A count in the claim statement's own snapshot would not see them, and two
#   workers could both see 1 leased and both claim one more.
# * Admissions within the same claim statement are remembered in a transaction-local setting
#   (leasequeue.conc_claim: "<claim id>;<key hash>=<used>;..."), because the statement's own
#   UPDATE has not run yet when its later candidates are examined. A new claim id resets it.
# * Keys that are full (or busy with another claimer) for the rest of the claim are also listed in
#   a second setting, leasequeue.conc_closed ("<claim id>;<hashtext(key)>;..."), which the claim
#   statement checks inline with strpos() before calling this function: a backlog of one full key
#   is then skipped at ~0.3 us per row (a plpgsql call costs ~3 us), while the scan keeps looking
#   for other keys and keyless jobs.
#
# The result is conservative, never over: a candidate that is admitted but then skipped by SKIP
# LOCKED, re-checked after a concurrent update, or trimmed by the claim's outer LIMIT still counts
# as used for this one statement, so a key may get fewer jobs in one claim, never more than its
# limit. Keyless jobs never call it (the claim tests concurrency_key IS NULL first).
CONC_ADMIT_FUNCTION = """
CREATE OR REPLACE FUNCTION leasequeue_conc_admit(p_key text, p_limit integer, p_claim text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    state text := current_setting('leasequeue.conc_claim', true);
    tag text := ';' || hashtextextended(p_key, 0)::text || '=';
    pos integer := 0;
    rest text;
    cnt text;
    used integer;
BEGIN
    IF state IS NULL OR split_part(state, ';', 1) IS DISTINCT FROM p_claim THEN
        state := p_claim;
        PERFORM set_config('leasequeue.conc_closed', p_claim || ';', true);
    ELSE
        pos := strpos(state, tag);
    END IF;
    IF pos > 0 THEN
        rest := substr(state, pos + length(tag));
        cnt := split_part(rest, ';', 1);
        used := cnt::integer;
        IF used >= p_limit THEN
            RETURN false;
        END IF;
        PERFORM set_config('leasequeue.conc_claim',
            left(state, pos - 1) || tag || (used + 1)::text || substr(rest, length(cnt) + 1), true);
        IF used + 1 >= p_limit THEN
            PERFORM set_config('leasequeue.conc_closed',
                current_setting('leasequeue.conc_closed', true) || hashtext(p_key)::text || ';', true);
        END IF;
        RETURN true;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'django-leasequeue: claiming jobs with a concurrency key needs READ COMMITTED '
                        'isolation (the fresh per-key count depends on it), not %',
                        current_setting('transaction_isolation');
    END IF;
    -- A full key is rejected without the lock (a concurrent claim can only add to the count),
    -- so claimers contend only for keys that have a free slot.
    SELECT count(*) INTO used FROM leasequeue_job
    WHERE concurrency_key = p_key AND (status COLLATE "C") = 'leased' AND concurrency_key IS NOT NULL;
    IF used < p_limit THEN
        IF pg_try_advisory_xact_lock(1279395153, hashtext(p_key)) THEN
            -- Count again: this snapshot is taken after the lock, so it sees every claim of the
            -- key that committed before (the one above may predate the last holder's commit).
            SELECT count(*) INTO used FROM leasequeue_job
            WHERE concurrency_key = p_key AND (status COLLATE "C") = 'leased' AND concurrency_key IS NOT NULL;
        ELSE
            used := 2147483647;
        END IF;
    END IF;
    PERFORM set_config('leasequeue.conc_claim',
        state || tag || (CASE WHEN used >= p_limit THEN used ELSE used + 1 END)::text, true);
    IF used >= p_limit - 1 THEN  -- full now, or after this admission (used may be the busy marker)
        PERFORM set_config('leasequeue.conc_closed',
            current_setting('leasequeue.conc_closed', true) || hashtext(p_key)::text || ';', true);
    END IF;
    RETURN used < p_limit;
END
$$;
"""


# The per-key count of leased jobs that leasequeue_conc_admit() runs up to twice per key per claim.
# Spelled (status COLLATE "C") = 'leased' in both the predicate and the count, on purpose: written
# as status = 'leased', the count also matches leasequeue_job_leased (on id), and the planner picks
# that index with a Filter on the key whenever its statistics show few leased rows (measured: it
# did even with 2,000 of 20,000 rows leased), so each count visited every leased row of every
# queue, dead versions included, and a claim of 50 keyed jobs did ~100 such scans (0.08x plain in
# flow_bench). The "C" collation gives the same equality on status, but no other partial index's
# predicate can be proven from it, so this index (an index-only scan with an Index Cond on the key)
# is the only one the count can use. Keyless jobs never enter it. Kept out of Django's model
# state because Index(condition=...) cannot spell a collation.
CONC_COUNT_INDEX = """
CREATE INDEX IF NOT EXISTS leasequeue_job_conc_admit ON leasequeue_job (concurrency_key)
WHERE (status COLLATE "C") = 'leased' AND concurrency_key IS NOT NULL;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="queuestate",
            name="rate_log",
            field=models.JSONField(
                blank=True, default=list,
                help_text="[[claim time as epoch seconds (database clock), jobs claimed], ...] inside the rate window",
            ),
        ),
        migrations.AddField(
            model_name="queuestate",
            name="throttled_total",
            field=models.BigIntegerField(default=0, help_text="claims cut short by the queue's rate limit"),
        ),
        migrations.RunSQL(CONC_COUNT_INDEX, "DROP INDEX IF EXISTS leasequeue_job_conc_admit;"),
        migrations.RunSQL(CONC_ADMIT_FUNCTION, "DROP FUNCTION IF EXISTS leasequeue_conc_admit(text, integer, text);"),
    ]
