"""Where the browser tests save their screenshots: never in the tree unless asked (a
test run, in CI too, must leave the checkout clean); ``make screenshots`` asks."""

from __future__ import annotations

from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.conftest import DOCS_SCREENSHOTS, SCREENSHOTS_ENV, screenshot

ROOT = Path(__file__).resolve().parents[2]


def _tree_pngs() -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for p in DOCS_SCREENSHOTS.glob("*.png")}


def test_a_screenshot_goes_to_the_folder_given(
    browser: WebDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _tree_pngs()
    monkeypatch.setenv(SCREENSHOTS_ENV, str(tmp_path / "shots"))
    browser.get("about:blank")
    path = screenshot(browser, "overview")
    assert path == tmp_path / "shots" / "overview.png"
    assert path.read_bytes().startswith(b"\x89PNG")
    assert _tree_pngs() == before


def test_without_a_folder_given_a_screenshot_stays_out_of_the_tree(
    browser: WebDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _tree_pngs()
    monkeypatch.delenv(SCREENSHOTS_ENV, raising=False)
    browser.get("about:blank")
    path = screenshot(browser, "overview")
    assert path.is_file()
    assert ROOT not in path.resolve().parents, path
    assert _tree_pngs() == before
