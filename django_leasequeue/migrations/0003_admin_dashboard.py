# The admin's queue dashboard: a proxy of QueueState, no table. It gives the dashboard an entry in
# the admin index, the URL admin/django_leasequeue/dashboard/ and a view permission.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("django_leasequeue", "0002_flow_control"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "queue dashboard",
                "verbose_name_plural": "queue dashboard",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("django_leasequeue.queuestate",),
        ),
    ]
