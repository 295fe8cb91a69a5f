# The retention pruner's place in its pass over the finished rows (store.job_prune), kept in the
# one-row sweep record so that whichever process prunes next continues from it. Three nullable
# columns without defaults: catalog only, no rewrite.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0016_trace_context"),
    ]

    operations = [
        migrations.AddField(model_name="reapersweep", name="prune_pass_started_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="reapersweep", name="prune_from_finished_at",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="reapersweep", name="prune_from_id",
                            field=models.BigIntegerField(blank=True, null=True)),
    ]
