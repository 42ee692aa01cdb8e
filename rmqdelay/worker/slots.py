"""Handler slots: at most ``size`` handlers at a time."""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Slots"]


class Slots:
    """At most ``size`` handlers at a time. Waiting costs one future (no task); once
    closed, every wait ends with False (the delivery goes back to its queue)."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiters: collections.deque[asyncio.Future[bool]] = collections.deque()
        self._closed = False

    async def acquire(self) -> bool:
        if self._closed:
            return False
        if self.free > 0:
            self.free -= 1
            return True
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            handed = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release()  # handed a slot as it was cancelled: pass it on
            raise
        if handed and self._closed:  # handed a slot, then closed before it resumed
            self.release()
            return False
        return handed

    def release(self) -> None:
        """Hand the slot to the first waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(True)
                return
        self.free += 1

    def close(self) -> None:
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(False)
