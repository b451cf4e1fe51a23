"""The operator side: records, the dashboard and its feed, the process lifecycle.

These modules *listen* (:mod:`sessions.hooks`, connected in ``AppConfig.ready``) and call
inward (backends, bus); nothing in the bus, wire format, backends, runtime or transport
imports them.
"""
