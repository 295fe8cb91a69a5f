from django.contrib import admin
from django.urls import include, path
from qa.views import enqueue_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("leasequeue/", include("django_leasequeue.urls")),
    path("qa/enqueue/<str:mode>/", enqueue_view),
]
