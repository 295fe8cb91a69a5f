# The job's W3C trace context (OpenTelemetry, django_leasequeue.tracing), written by the enqueue's
# INSERT. A nullable column without a default: PostgreSQL adds it to the catalog only, rewriting no
# row and holding its lock for an instant, whatever the table's size.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_leasequeue', '0015_job_stats'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='trace_context',
            field=models.JSONField(blank=True, editable=False, help_text='W3C trace context of the enqueue (OpenTelemetry)', null=True),
        ),
    ]
