"""Benchmarks: qwenweb against django-eventstream and a raw-asyncio floor.

Run ``python -m bench.run [--quick] [--json out.json]``; ``docs/benchmarks.md`` explains the
scenarios and holds the latest tables. Nothing here is imported by the app or the tests.
"""
