"""Clients that run outside the server: the terminal client and the scripted demo agent."""
