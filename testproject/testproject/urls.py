from django.apps import apps
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("leasequeue/", include("django_leasequeue.urls")),
]
# The qa app's enqueue view (tests/pgbouncer), only where the settings install the app: some tests
# run this project's URLs with settings of their own that leave it out.
if apps.is_installed("qa"):
    from qa.views import enqueue_view

    urlpatterns.append(path("qa/enqueue/<str:mode>/", enqueue_view))
