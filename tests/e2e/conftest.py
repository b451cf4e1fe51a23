"""End-to-end fixtures: one real daphne process per test session on 127.0.0.1, one real
production entry point per module that asks for it, the migrated databases the servers
share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import (
    ServerProcess,
    daphne_argv,
    migrate,
    serve_argv,
    server_env,
    started_server,
)
from tests.support.staff import staffed_database


@pytest.fixture(scope="session")
def e2e_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("e2e") / "db.sqlite3"
    migrate(path)
    return path


@pytest.fixture(scope="module")
def staff_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A migrated SQLite file with a staff user (``tests.support.staff``), one per module."""
    return staffed_database(tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]))


@pytest.fixture(scope="session")
def daphne_server(
    e2e_database: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """daphne on ``e2e_database``, heartbeat 1 s."""
    env = server_env(e2e_database, QWENWEB_HEARTBEAT_INTERVAL_S="1")
    log = tmp_path_factory.mktemp("logs") / "daphne.log"
    with started_server(daphne_argv, env, log) as server:
        yield server


@pytest.fixture(scope="module")
def serve_server(
    e2e_database: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The production entry point (``python -m qwenweb.serve``) on ``e2e_database``,
    heartbeat 1 s."""
    env = server_env(e2e_database, QWENWEB_HEARTBEAT_INTERVAL_S="1")
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    with started_server(serve_argv, env, log) as server:
        yield server
