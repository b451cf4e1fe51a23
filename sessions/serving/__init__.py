"""What the command lines that start a server share: where a server may listen
(:mod:`sessions.serving.listen`) and the local TLS certificate of the demo and the tests
(:mod:`sessions.serving.devcert`). The management commands themselves live in
``sessions/management/commands/``; ``python -m qwenweb.serve`` in ``qwenweb/serve.py``."""
