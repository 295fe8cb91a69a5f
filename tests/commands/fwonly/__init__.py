"""An app whose only tasks are Django tasks framework tasks (``@django.tasks.task``): what a
project moving from another ``django.tasks`` backend has. ``tests.commands.fwonly_settings`` installs it."""
