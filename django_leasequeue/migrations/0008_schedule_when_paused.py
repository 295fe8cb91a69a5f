# A schedule"s policy for a paused target queue (when_paused) and its record of the occurrences it
# skipped or coalesced. Database defaults: adding the columns rewrites nothing on PostgreSQL 11+,
# and statements that insert schedule rows without naming them get the defaults.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0007_reaper_sweep"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="paused_coalesced",
            field=models.PositiveBigIntegerField(db_default=0, default=0, help_text="occurrences superseded by a later one while the queue was paused (when_paused=latest)"),
        ),
        migrations.AddField(
            model_name="schedule",
            name="paused_log",
            field=models.JSONField(blank=True, db_default=[], default=list, help_text="the newest skipped or coalesced occurrences: [{occurrence, action, queue, job, kept, at}, ...]"),
        ),
        migrations.AddField(
            model_name="schedule",
            name="paused_skipped",
            field=models.PositiveBigIntegerField(db_default=0, default=0, help_text="occurrences not emitted because the queue was paused (when_paused=skip)"),
        ),
        migrations.AddField(
            model_name="schedule",
            name="when_paused",
            field=models.CharField(choices=[("latest", "keep one pending job: the latest occurrence"), ("skip", "skip occurrences while paused"), ("all", "keep every occurrence's job")], db_default="latest", default="latest", help_text="while the target queue is paused: latest (one pending job), skip, or all", max_length=10),
        ),
    ]
