# Time-partitioned history (LEASEQUEUE["HISTORY"], off by default; docs/howto/history.md): the
# parent of the partitions that finished jobs move into, range-partitioned on finished_at. The
# partitions themselves are created ahead, and dropped past RETENTION, by the maintenance
# (store.history_maintain); this migration creates only the empty parent, which costs nothing
# when the setting is off (no partition, no row).
#
# The columns are the job table's as of this migration (LIKE ... INCLUDING DEFAULTS: names, types,
# NOT NULL and defaults; no index, no constraint, no foreign key), so that a moved row is the same
# row. A later migration that adds, drops or changes a job column must do the same here (a test,
# tests/store/test_history.py, compares the two tables column by column). No primary key: a
# partitioned table's unique index must include the partition key, and the id is already unique
# (it was the hot table's primary key, and a job is moved once). The index on id serves the
# lookups of a moved job's result (one probe per partition).
#
# The sweep record gains the mover's place (as 0017 gave the pruner its own): three nullable
# columns without defaults, catalog only.

from django.db import migrations, models

FORWARD = [
    "CREATE TABLE leasequeue_job_history (LIKE leasequeue_job INCLUDING DEFAULTS) PARTITION BY RANGE (finished_at)",
    "CREATE INDEX leasequeue_job_history_id ON leasequeue_job_history (id)",
]
BACKWARD = ["DROP TABLE IF EXISTS leasequeue_job_history CASCADE"]


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0019_job_insert_defaults"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, reverse_sql=BACKWARD),
        migrations.AddField(model_name="reapersweep", name="history_pass_started_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="reapersweep", name="history_from_finished_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="reapersweep", name="history_from_id",
                            field=models.BigIntegerField(blank=True, null=True)),
    ]
