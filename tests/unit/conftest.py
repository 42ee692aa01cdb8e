"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from rmqdelay.settings import load_settings
from rmqdelay.settings_light import load_light_settings

Load = Callable[..., Any]
"""``load(config=None, **flags)``: settings from a TOML file, the environment and flags."""


@pytest.fixture(params=["model", "light"])
def load(request: pytest.FixtureRequest) -> Load:
    """Each settings loader in turn: the model's (``load_settings``), and the light one
    of ``rmqdelay publish`` (``load_light_settings``). A test that takes ``load`` holds
    for both: the same values, and the same errors word for word."""
    loaders: dict[str, Load] = {"model": load_settings, "light": load_light_settings}
    return loaders[request.param]
