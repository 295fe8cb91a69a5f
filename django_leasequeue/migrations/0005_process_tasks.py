# Rolling deploys: each worker records the task names it can run in the process registry, so a
# job of a task no live worker knows is dead-lettered only after UNKNOWN_TASK_GRACE, judged in the
# database. A nullable column without a default: adding it rewrites nothing and locks the small
# process table only for an instant; rows of workers that predate it stay NULL ("knows every task").

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0004_check_constraints"),
    ]

    operations = [
        migrations.AddField(
            model_name="workerprocess",
            name="tasks",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
