"""Fixtures of the browser tests: the dashboard served by uvicorn on a free port, a
worker running beside it, and headless Chromium driven by Selenium (Debian's
``chromium`` and ``chromium-driver``: ``make test-browser`` installs them)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from rmqdelay import Settings, Worker
from rmqdelay.dashboard.app import create_app

DOCS_SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
"""Where ``make screenshots`` has them written (docs/guides/dashboard.md shows one)."""
SCREENSHOTS_ENV = "RMQDELAY_SCREENSHOTS"
"""The folder the tests save their screenshots in; unset, one under the temp folder, so
a test run leaves the tree (and CI's checkout) clean."""


def screenshots_dir() -> Path:
    """The folder screenshots go to: ``$RMQDELAY_SCREENSHOTS``, else a temp folder."""
    chosen = os.environ.get(SCREENSHOTS_ENV, "").strip()
    if chosen:
        return Path(chosen)
    return Path(tempfile.gettempdir()) / "rmqdelay-screenshots"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _chromium() -> tuple[str, str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or "/usr/lib/chromium/chromedriver"
    if binary is None or not Path(driver).exists():
        message = "the browser tests need Debian's chromium and chromium-driver (apt-get install)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return binary, driver


@pytest.fixture(scope="session")
def browser() -> Iterator[WebDriver]:
    """Headless Chromium, 1280x900, for the whole session (one start costs ~1 s)."""
    binary, driver = _chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    options.add_argument("--window-size=1280,900")
    chrome = webdriver.Chrome(options=options, service=Service(executable_path=driver))
    chrome.implicitly_wait(0)
    try:
        yield chrome
    finally:
        chrome.quit()


class Served:
    """The dashboard on ``base`` (uvicorn in a thread of its own) until stopped."""

    def __init__(self, settings: Settings) -> None:
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_app(settings), host="127.0.0.1", port=port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive(), "the dashboard's server stopped at start"
            assert time.monotonic() < deadline, "the dashboard's server did not start in 20 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


class Running:
    """A worker running in a thread (its own event loop) until stopped."""

    def __init__(self, app: Worker) -> None:
        self.app = app
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            async with self.app.running():
                self._ready.set()
                await self._stop.wait()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> Running:
        self.thread.start()
        assert self._ready.wait(30), "the worker did not start in 30 s"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)


def wait_until(check: Callable[[], Any], within_s: float, what: str) -> Any:
    """Poll ``check`` until it is truthy; fail naming ``what`` after ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        time.sleep(0.05)


def screenshot(browser: WebDriver, name: str) -> Path:
    """Save the page as <name>.png in :func:`screenshots_dir` and return its path."""
    folder = screenshots_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.png"
    browser.save_screenshot(str(path))
    return path
