"""Clients that run outside the server (the terminal client, the scripted demo agent), and
what the command lines that start a server share (:mod:`sessions.cli.listen`)."""
