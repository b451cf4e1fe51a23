"""Fixtures of the unit tests: the bus logger's records (``bus_log``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import sessions.bus.eventbus as eventbus_module


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def bus_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the bus logger (attached directly: settings may stop propagation)."""
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    logger = logging.getLogger(eventbus_module.logger.name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)
