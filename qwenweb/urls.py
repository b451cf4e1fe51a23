"""URL configuration: the admin and the sessions app.

``GET /session/<id>/events`` never reaches these patterns: ``qwenweb.asgi`` routes it to
the streaming handler in front of Django (EB-22).
"""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("sessions.urls")),
]
