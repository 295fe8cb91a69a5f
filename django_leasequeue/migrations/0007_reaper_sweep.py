# The reaper's sweep record (one row): when the reaper last swept and when the database last came
# back after a silence, so that an outage that hit every process is not read as every worker dying.
# A new, empty table: no lock on the job table.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0006_timeouts"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReaperSweep",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("last_sweep_at", models.DateTimeField()),
                ("resumed_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "db_table": "leasequeue_reaper_sweep",
            },
        ),
    ]
