# The finished index gains the id as its last column: (status, finished_at, id). The retention
# pruner starts each batch at the (finished_at, id) of the first row the previous batch deleted
# (store.JOB_PRUNE); with the id in the index that position is where the index scan starts (a
# row comparison in the index condition), also inside a run of rows finished at the same instant
# (a bulk cancel, a completion batch), so no batch walks the entries of all the rows deleted since
# the last vacuum. The queries that used the old index (dead-letter lists, finished-in-window
# counts) use the new one: its leading columns are the same. Its cost: entries with equal
# (status, finished_at) are no longer deduplicated, so the index is larger where many jobs finish
# at the same instant (docs/howto/performance.md measures it).
#
# How, without blocking writes to a large job table: the new index is built CONCURRENTLY beside the
# old one under a temporary name, the old one is dropped CONCURRENTLY, and the new one takes the
# old name. The migration is therefore not atomic (each step commits on its own); applied again
# after an interruption at any step, it starts over from a clean state (the first step drops a
# half-built index, which an interrupted CONCURRENTLY build leaves INVALID).
#
# The statements are plain SQL so that each can say IF [NOT] EXISTS; the model state moves with
# them (state operations only).

from django.db import migrations, models

CONDITION = "WHERE status IN ('done', 'dead', 'cancelled')"


def _swap(columns: str) -> list[str]:
    return [
        "DROP INDEX CONCURRENTLY IF EXISTS leasequeue_job_finished_new",
        f"CREATE INDEX CONCURRENTLY leasequeue_job_finished_new ON leasequeue_job ({columns}) {CONDITION}",
        "DROP INDEX CONCURRENTLY IF EXISTS leasequeue_job_finished",
        "ALTER INDEX leasequeue_job_finished_new RENAME TO leasequeue_job_finished",
    ]


class Migration(migrations.Migration):

    atomic = False

    dependencies = [
        ("django_leasequeue", "0017_prune_place"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(_swap("status, finished_at, id"), reverse_sql=_swap("status, finished_at")),
            ],
            state_operations=[
                migrations.RemoveIndex(model_name="job", name="leasequeue_job_finished"),
                migrations.AddIndex(model_name="job", index=models.Index(
                    condition=models.Q(("status__in", ["done", "dead", "cancelled"])),
                    fields=["status", "finished_at", "id"], name="leasequeue_job_finished")),
            ],
        ),
    ]
