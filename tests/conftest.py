from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg import embedded_postgres, fresh_database
from tests.real_model import local_model_server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


SLOW = ("real_model", "real_install")  # markers of the tests that run last
TEST_TIMEOUT_S = 600.0  # generous: it is there to catch a hang, not a slow test


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # Each test's time limit (pytest-timeout, in the `test` extra), unless --timeout or PYTEST_TIMEOUT
    # sets another. Set here, not as `timeout` in pyproject.toml: where the plugin is missing, that
    # unknown key stops pytest from starting at all (warnings are errors).
    given = config.getoption("timeout", None) is not None or "PYTEST_TIMEOUT" in os.environ
    if config.pluginmanager.hasplugin("timeout") and not given:
        config.option.timeout = TEST_TIMEOUT_S


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The real-model tests are slow (a real 135M model on one CPU thread), and so is building and installing
    # the wheel: the fast ones report first.
    items.sort(key=lambda item: any(item.get_closest_marker(slow) for slow in SLOW))


@pytest.fixture(scope="session")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SmolLM2-135M behind llama.cpp for the whole session: its base URL (started on first use)."""
    with local_model_server(tmp_path_factory.mktemp("local-model") / "server.log") as url:
        yield url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One embedded PostgreSQL (with pgvector) for the whole suite: its maintenance DSN.

    Not under pytest's temporary root: run as root, the server runs as its own system user, and
    pytest closes that root to others (0o700) whenever a pytest session starts.

    MCP_SPEC_PROXY_TEST_PG (the maintenance DSN of a running server with pgvector) runs the
    store's tests against that server instead: another version, another machine, an emulated CPU."""
    if given := os.environ.get("MCP_SPEC_PROXY_TEST_PG"):
        yield given
        return
    root = Path(tempfile.mkdtemp(prefix="mcp-spec-proxy-pg-"))
    try:
        with embedded_postgres(root / "data") as dsn:
            yield dsn
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(postgres_server: str) -> str:
    """A fresh, empty database of the suite's Postgres for this test."""
    return fresh_database(postgres_server)
