"""URLs of the session API (spec section 5)."""

from django.urls import path

from sessions import views

urlpatterns = [
    path("capabilities", views.capabilities, name="capabilities"),
    path("session", views.create_session, name="session-create"),
    path("session/<str:session_id>", views.load_session, name="session-detail"),
    path("session/<str:session_id>/events", views.session_events, name="session-events"),
    path("session/<str:session_id>/close", views.close_session, name="session-close"),
    path("session/<str:session_id>/token", views.session_token, name="session-token"),
]

# The operator's pages (issue 3); appended so the API patterns above stay untouched.
from sessions import pages  # noqa: E402

urlpatterns += [
    path("", pages.home, name="home"),
    path("sessions/", pages.session_list, name="session-list"),
    path("sessions/<str:session_id>/", pages.session_page, name="session-page"),
    path("sessions/<str:session_id>/demo", pages.start_demo, name="session-demo"),
]

# The operator dashboard and its live feed (issue 4). `/` is the dashboard for staff and
# delegates to `pages.home` for everyone else, so it goes in front: the first match wins.
from sessions import dashboard  # noqa: E402

urlpatterns.insert(0, path("", dashboard.home, name="dashboard"))
urlpatterns += [
    path("ops/events/", dashboard.operator_events, name="operator-events"),
    path("ops/sessions/<str:session_id>/records", dashboard.session_records, name="ops-records"),
]
