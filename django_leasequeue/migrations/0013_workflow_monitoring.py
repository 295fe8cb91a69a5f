# Monitoring of workflows: a partial index of the waiting jobs (dependencies not finished yet) by
# queue, so the health snapshot counts them per queue from the waiting rows alone, never from the
# retained finished rows. Creating it reads the job table once: migrate in a quiet moment on a
# large table. It holds no column a heartbeat writes, so lease renewals stay HOT updates.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_leasequeue', '0012_workflow_release_snapshot'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'waiting')), fields=['queue'], name='leasequeue_job_waiting'),
        ),
    ]
