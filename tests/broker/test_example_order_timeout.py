"""The order-timeout example: an unpaid order is cancelled when its timeout arrives."""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from rmqdelay import Settings
from rmqdelay.amqp.publisher import Publisher
from tests.helpers.worker_helpers import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "order_timeout"


@pytest.fixture
def service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("ORDERS_DB", str(tmp_path / "orders.db"))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    sys.modules.pop("service", None)
    return importlib.import_module("service")


async def test_unpaid_order_is_cancelled_after_its_timeout(
    service: ModuleType, amqp_url: str, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(url=amqp_url, prefix=prefix, max_delay="1h", connection_name=prefix)
    assert service.main(["setup"], settings) == 0
    orders = service.Orders()

    async with service.app.running(settings, concurrency=2):
        for order_id in (1, 2):
            args = ["place", str(order_id), "--timeout", "1s"]
            assert await asyncio.to_thread(service.main, args, settings) == 0
            assert orders.status(order_id) == "unpaid"  # its window has just opened
        assert await asyncio.to_thread(service.main, ["pay", "2"], settings) == 0
        await wait_until(lambda: orders.status(1) == "cancelled", 10, "order 1 cancelled")
        await asyncio.sleep(1)  # order 2's timeout has come and gone as well

    assert orders.status(2) == "paid"
    assert service.main(["pay", "1"], settings) == 1  # too late to pay
    out = capsys.readouterr().out
    assert "order 1 placed; cancelled at" in out and "order 2 paid" in out

    # The default payment window is 15 minutes.
    with Publisher(settings) as publisher:
        result = service.place_order(publisher, orders, 3)
    assert abs(result.due_at_ms - time.time() * 1000 - 15 * 60 * 1000) < 5000
    assert result.message_id == "order-3-timeout"
