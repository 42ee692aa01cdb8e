"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rmqdelay.settings import load_settings

Load = Callable[..., Any]
"""``load(config=None, **flags)``: settings from a TOML file, the environment and flags."""


@pytest.fixture
def load() -> Load:
    """The settings loader of every command and of the library (``load_settings``)."""
    return load_settings
