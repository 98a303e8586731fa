from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.real_model import local_model_server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The real-model tests are slow (a real 135M model on one CPU thread): the fast ones report first.
    items.sort(key=lambda item: item.get_closest_marker("real_model") is not None)


@pytest.fixture(scope="session")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """SmolLM2-135M behind llama.cpp for the whole session: its base URL (started on first use)."""
    with local_model_server(tmp_path_factory.mktemp("local-model") / "server.log") as url:
        yield url
