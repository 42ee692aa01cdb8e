"""The cluster tests kill, restart and partition nodes: each may take minutes, not the
suite's default 300 s (pytest-timeout)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(1200), append=False)
