"""The worker ``bench.history`` starts (``rmqdelay worker bench.history_app:app``): its
first handled message is the measure; the process ends right after that message's ack."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import rmqdelay
from bench import history_probe

DESTINATION = os.environ.get("BENCH_HISTORY_DESTINATION", "history")
app = rmqdelay.Worker()


@app.handler(DESTINATION)
async def first(message: Any, ctx: rmqdelay.Context) -> None:
    history_probe.report(handled_at=time.time(), message_id=ctx.message_id)
    asyncio.get_running_loop().call_later(0.2, os._exit, 0)  # after the ack
