"""URLs of django-leasequeue. Include them under a prefix of your choice::

    path("leasequeue/", include("django_leasequeue.urls")),   # -> /leasequeue/metrics
"""

from django.urls import path

from . import views

app_name = "leasequeue"

urlpatterns = [
    path("metrics", views.metrics, name="metrics"),
]
