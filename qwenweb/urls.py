"""URL configuration: the admin, the login pages and the sessions app.

``GET /session/<id>/events`` never reaches these patterns: ``qwenweb.asgi`` routes it to
the streaming handler in front of Django (EB-22).
"""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.staticfiles.urls import staticfiles_urlpatterns
from django.templatetags.static import static
from django.urls import URLPattern, URLResolver, include, path
from django.utils.functional import lazy
from django.views.generic.base import RedirectView

urlpatterns: list[URLPattern | URLResolver] = [
    path("admin/", admin.site.urls),
    # The login page for everyone (the admin's own login refuses users who are not staff).
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(redirect_authenticated_user=True),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("sessions.urls")),
    # Browsers ask for /favicon.ico on pages without an icon link (the admin's error pages).
    # Lazy: with DEBUG off the hashed name needs collectstatic's manifest, which must not
    # be read at import (the system checks import the URLconf before serve says it lacks).
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)("qwenweb/favicon.svg"))),
]

# `/static/` from the app's files when DEBUG is on (an empty list otherwise), so the session
# page works under plain `daphne` and `uvicorn` too, not only under `runserver`. In
# production run `collectstatic` and serve STATIC_ROOT from the front web server.
urlpatterns += staticfiles_urlpatterns()
