# Database defaults for the job columns whose value a new job always has: status 'ready', attempts,
# snoozes and lease_version 0, leased_by '', unique_scope 'retained', cancel_requested false, errors
# and history '[]'. The one-job enqueue INSERT (store/enqueue.py) then lists only the columns the
# job sets, a shorter statement for PostgreSQL to parse and plan on every call. Each step is a
# catalog-only ALTER COLUMN ... SET DEFAULT (no table rewrite, a brief lock); reversed, DROP DEFAULT.

from django.db import migrations, models

import django_leasequeue.models


class Migration(migrations.Migration):

    dependencies = [
        ('django_leasequeue', '0018_finished_index_id'),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='attempts',
            field=models.PositiveIntegerField(db_default=0, default=0, help_text='claims so far (a claim is an attempt)'),
        ),
        migrations.AlterField(
            model_name='job',
            name='cancel_requested',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AlterField(
            model_name='job',
            name='errors',
            field=models.JSONField(blank=True, db_default=[], decoder=django_leasequeue.models.JobJSONDecoder, default=list),
        ),
        migrations.AlterField(
            model_name='job',
            name='history',
            field=models.JSONField(blank=True, db_default=[], decoder=django_leasequeue.models.JobJSONDecoder, default=list, help_text='operator events: replay, edit, cancel'),
        ),
        migrations.AlterField(
            model_name='job',
            name='lease_version',
            field=models.BigIntegerField(db_default=0, default=0, help_text='fencing token, +1 on every claim'),
        ),
        migrations.AlterField(
            model_name='job',
            name='leased_by',
            field=models.CharField(blank=True, db_default='', default='', max_length=255),
        ),
        migrations.AlterField(
            model_name='job',
            name='snoozes',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.AlterField(
            model_name='job',
            name='status',
            field=models.CharField(choices=[('ready', 'ready'), ('waiting', 'waiting'), ('leased', 'leased'), ('done', 'done'), ('dead', 'dead'), ('cancelled', 'cancelled')], db_default='ready', default='ready', max_length=10),
        ),
        migrations.AlterField(
            model_name='job',
            name='unique_scope',
            field=models.CharField(choices=[('retained', 'retained'), ('active', 'active')], db_default='retained', default='retained', max_length=10),
        ),
    ]
