# Sequences: jobs with the same sequence_key run one at a time, in enqueue (id) order.
#
# Two nullable/defaulted columns (no table rewrite: sequence_key is NULL, sequence_halts has a
# database default), the HaltedSequence proxy for the admin, and two partial indexes that hold only
# rows with a sequence key, so jobs without one never enter them:
# * leasequeue_job_seq_order (sequence_key, id), for ready, leased and dead rows: the claim's probe
#   "is an earlier job of this sequence ready, leased or a halting dead job?";
# * leasequeue_job_seq_leased (sequence_key), for leased rows: "is any job of this sequence
#   running?". Spelled (status COLLATE "C") = 'leased' for the reason given for
#   leasequeue_job_conc_admit in 0002_flow_control: no other partial index's predicate can be
#   proven from that spelling, so the planner cannot probe leasequeue_job_leased (every leased row
#   of every queue) with a Filter on the key instead. Kept out of Django's model state because
#   Index(condition=...) cannot spell a collation.

from django.db import migrations, models

SEQ_LEASED_INDEX = """
CREATE INDEX IF NOT EXISTS leasequeue_job_seq_leased ON leasequeue_job (sequence_key)
WHERE (status COLLATE "C") = 'leased' AND sequence_key IS NOT NULL;
"""


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0008_schedule_when_paused"),
    ]

    operations = [
        migrations.CreateModel(
            name="HaltedSequence",
            fields=[],
            options={
                "verbose_name": "halted sequence",
                "verbose_name_plural": "halted sequences",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("django_leasequeue.job",),
        ),
        migrations.AddField(
            model_name="job",
            name="sequence_key",
            field=models.CharField(blank=True, help_text="jobs with the same key run one at a time, in enqueue order",
                                   max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="sequence_halts",
            field=models.BooleanField(db_default=False, default=False,
                                      help_text="when dead, hold the sequence until replayed or skipped"),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(condition=models.Q(("sequence_key__isnull", False),
                                                  ("status__in", ["ready", "leased", "dead"])),
                               fields=["sequence_key", "id"], name="leasequeue_job_seq_order"),
        ),
        migrations.RunSQL(SEQ_LEASED_INDEX, "DROP INDEX IF EXISTS leasequeue_job_seq_leased;"),
    ]
