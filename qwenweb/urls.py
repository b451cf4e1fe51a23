"""URL configuration: the admin and the sessions app.

``GET /session/<id>/events`` never reaches these patterns: ``qwenweb.asgi`` routes it to
the streaming handler in front of Django (EB-22).
"""

from django.contrib import admin
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.templatetags.static import static
from django.urls import URLPattern, URLResolver, include, path
from django.views.generic.base import RedirectView

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    path("", include("sessions.urls")),
    # Browsers ask for /favicon.ico on pages without an icon link (the admin's error pages).
    path("favicon.ico", RedirectView.as_view(url=static("qwenweb/favicon.svg"))),
]

# `/static/` from the app's files when DEBUG is on (an empty list otherwise), so the session
# page works under plain `daphne` and `uvicorn` too, not only under `runserver`. In
# production run `collectstatic` and serve STATIC_ROOT from the front web server.
urlpatterns += staticfiles_urlpatterns()
