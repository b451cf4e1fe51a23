"""The web side: the JSON API views, the user's pages and the in-server demo agent.

Thin glue over the backend (:func:`sessions.backends.get_backend`) and the access policy
(:mod:`sessions.auth`); nothing inward imports it.
"""
