"""The dashboard in a real browser (headless Chromium through Selenium): a message
cancelled from its page is not handled, a parked message replayed from the page is,
and a recurring schedule is paused and resumed from the page. Each test saves a
screenshot of its page in $RMQDELAY_SCREENSHOTS, else a temp folder (``make screenshots``
writes them to docs/screenshots, which docs/guides/dashboard.md shows)."""

from __future__ import annotations

import re
import uuid

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait

from rmqdelay import Publisher
from rmqdelay.worker.context import Context
from tests.browser.conftest import Running, Served, screenshot, wait_until
from tests.helpers.parking import park
from tests.helpers.worker_helpers import TestTopology, WorkerCase


def _worker(shared_topology: TestTopology) -> WorkerCase:
    case = shared_topology.worker(journal_bodies=True)
    dest, _settings, app, calls = case

    @app.handler(dest)
    async def handle(msg: bytes, ctx: Context) -> None:
        calls.record(msg, ctx)

    return case


def _confirm(browser: WebDriver, button: str) -> None:
    """Click an action's button and accept its confirmation."""
    browser.find_element(By.CSS_SELECTOR, button).click()
    WebDriverWait(browser, 10).until(ec.alert_is_present())
    browser.switch_to.alert.accept()


def _result(browser: WebDriver) -> str:
    found = WebDriverWait(browser, 30).until(
        ec.presence_of_element_located((By.CSS_SELECTOR, "#result"))
    )
    return str(found.text)


def test_a_message_cancelled_from_its_page_is_not_handled(
    shared_topology: TestTopology, browser: WebDriver
) -> None:
    dest, settings, app, calls = _worker(shared_topology)
    doomed, control = f"doomed-{uuid.uuid4().hex[:6]}", f"control-{uuid.uuid4().hex[:6]}"
    with Running(app), Served(settings) as served:
        with Publisher(settings) as publisher:
            publisher.publish(dest, b"doomed", delay="6s", message_id=doomed)
            publisher.publish(dest, b"control", delay="6500ms", message_id=control)
        browser.get(f"{served.base}/scheduled?destination={dest}")
        row = browser.find_element(By.CSS_SELECTOR, f'tr.message-row[data-id="{doomed}"]')
        due = row.find_element(By.CSS_SELECTOR, "td.due").text
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", due), due
        assert browser.find_element(By.CSS_SELECTOR, f'tr[data-id="{control}"]')
        screenshot(browser, "scheduled")
        row.find_element(By.LINK_TEXT, doomed).click()
        _confirm(browser, "#cancel")
        assert _result(browser).startswith(f"{doomed}: cancelled (was due")
        screenshot(browser, "cancelled")
        wait_until(lambda: calls.of(control), 30, "the control message, due just after")
        assert calls.of(doomed) == []
        browser.get(f"{served.base}/scheduled/{doomed}")
        assert browser.find_element(By.ID, "state-1").text == "cancelled"


def test_a_parked_message_replayed_from_the_page_is_handled(
    shared_topology: TestTopology, browser: WebDriver
) -> None:
    dest, settings, app, calls = _worker(shared_topology)
    parked = f"parked-{uuid.uuid4().hex[:6]}"
    park(settings, dest, parked, body=b"again")
    with Running(app), Served(settings) as served:
        browser.get(f"{served.base}/parked")
        row = browser.find_element(By.CSS_SELECTOR, f'tr.parked-row[data-id="{parked}"]')
        assert "handler gave up" in row.find_element(By.CSS_SELECTOR, "td.reason").text
        screenshot(browser, "parked")
        row.find_element(By.CSS_SELECTOR, "button.replay-one").click()
        WebDriverWait(browser, 10).until(ec.alert_is_present())
        browser.switch_to.alert.accept()
        assert _result(browser) == "replayed 1 message(s)"
        screenshot(browser, "replayed")
        (call,) = wait_until(lambda: calls.of(parked), 30, "the replayed message's handling")
        assert call.value == b"again" and call.attempt == 1


def test_a_recurring_schedule_paused_and_resumed_from_the_page(
    shared_topology: TestTopology, browser: WebDriver
) -> None:
    dest, settings, _app, _calls = _worker(shared_topology)
    name = f"{dest}-every-20m"
    with Publisher(settings) as publisher:
        publisher.add_recurring(name, dest, b"tick", every="20m")
    with Served(settings) as served:

        def state() -> str:
            browser.get(f"{served.base}/recurring")
            row = browser.find_element(By.CSS_SELECTOR, f'tr.recurring-row[data-name="{name}"]')
            return str(row.find_element(By.CSS_SELECTOR, "td.state").text)

        assert state() == "active"
        _confirm(browser, f'tr[data-name="{name}"] button.pause')
        assert _result(browser).startswith(f"{name}: paused")
        assert state() == "paused"
        screenshot(browser, "recurring")
        _confirm(browser, f'tr[data-name="{name}"] button.resume')
        assert _result(browser).startswith(f"{name}: resumed")
        assert state() == "active"
    with Publisher(settings) as publisher:
        publisher.remove_recurring(name)


def test_the_overview_draws_its_chart_and_refreshes(
    shared_topology: TestTopology, browser: WebDriver
) -> None:
    dest, settings, _app, _calls = _worker(shared_topology)
    with Publisher(settings) as publisher:
        for n, delay in enumerate(("30s", "10m", "50m")):
            publisher.publish(dest, b"x", delay=delay, message_id=f"overview-{n}-{dest}")
    with Served(settings) as served:
        browser.get(f"{served.base}/")
        WebDriverWait(browser, 20).until(
            lambda b: b.execute_script(
                "const c = document.querySelector('#due-chart');"
                "return c && window.Chart && Chart.getChart(c) !== undefined;"
            )
        )
        table = browser.find_element(By.ID, "by-destination").text
        assert f"{dest} 3" in table
        first = browser.find_element(By.ID, "overview")
        # htmx swaps the panel every 5 s: the element found first goes stale
        WebDriverWait(browser, 20).until(ec.staleness_of(first))
        WebDriverWait(browser, 20).until(
            lambda b: b.execute_script(
                "return Chart.getChart(document.querySelector('#due-chart')) !== undefined;"
            )
        )
        screenshot(browser, "overview")
