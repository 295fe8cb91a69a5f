# Interrupted attempts: the count of refunded attempts whose handler a graceful stop cut short,
# bounded by MAX_INTERRUPTIONS. A constant database default, so PostgreSQL adds the column without
# rewriting the table (no long lock on a large one).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0005_process_tasks"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="interruptions",
            field=models.PositiveIntegerField(
                db_default=0, default=0,
                help_text="attempts refunded because a graceful stop interrupted the handler"),
        ),
    ]
