"""Transports: how frames reach clients. Today the SSE route over ASGI
(:mod:`sessions.transport.stream`, :mod:`sessions.transport.pump`) and daphne with flow
control (:mod:`sessions.transport.flow_control`). A new transport (a WebSocket consumer over
the same bus) is a new module here: see docs/architecture.md.
"""
