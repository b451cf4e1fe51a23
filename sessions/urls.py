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
