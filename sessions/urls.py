"""Every URL of the sessions app, in one list (docs/protocol.md, "Endpoints").

``GET /session/<id>/events`` (the stream) is routed in front of Django by ``qwenweb.asgi``;
the pattern here serves the other methods (``POST`` = publish) and names the URL.
"""

from django.urls import path

from sessions.ops import dashboard
from sessions.web import demo, pages, subscribers, views

urlpatterns = [
    # The session API.
    path("capabilities", views.capabilities, name="capabilities"),
    path("session", views.create_session, name="session-create"),
    path("session/<str:session_id>", views.load_session, name="session-detail"),
    path("session/<str:session_id>/events", views.session_events, name="session-events"),
    path("session/<str:session_id>/close", views.close_session, name="session-close"),
    path("session/<str:session_id>/token", views.session_token, name="session-token"),
    # Operators: the live subscribers of a session, and disconnecting one.
    path(
        "session/<str:session_id>/subscribers",
        subscribers.session_subscribers,
        name="session-subscribers",
    ),
    path(
        "session/<str:session_id>/subscribers/<str:subscriber_id>/disconnect",
        subscribers.disconnect_subscriber,
        name="session-subscriber-disconnect",
    ),
    # The session page: is its (paused) reader still connected?
    path(
        "session/<str:session_id>/readers/<str:client_id>",
        subscribers.reader_status,
        name="session-reader",
    ),
    # The pages: `/` is the dashboard for staff and a redirect to the list for everyone else.
    path("", dashboard.home, name="dashboard"),
    path("sessions/", pages.session_list, name="session-list"),
    path("sessions/<str:session_id>/", pages.session_page, name="session-page"),
    path("sessions/<str:session_id>/demo", demo.start_demo, name="session-demo"),
    # The operators' feed and records.
    path("ops/events/", dashboard.operator_events, name="operator-events"),
    path("ops/sessions/<str:session_id>/records", dashboard.session_records, name="ops-records"),
]
