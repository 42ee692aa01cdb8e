"""Consumer workers: the app users write, the runner that consumes, and settling.

``app`` holds the handler registry and its hooks; ``runner`` the connection loop and
shutdown, over ``session`` (one connection), ``reconnect`` (its pauses) and ``process``
(each delivery: hooks, handler, ``settle``). ``cancel``, ``logs`` and ``metrics`` are
the worker's own hooks (``hooks``).
"""

from ..errors import WorkerError
from .app import RunOptions, Worker
from .delivery import Delivery
from .hooks import Admission, Outcome, Settled, WorkerHook
from .runner import RunningWorker

__all__ = [
    "Admission",
    "Delivery",
    "Outcome",
    "RunOptions",
    "RunningWorker",
    "Settled",
    "Worker",
    "WorkerError",
    "WorkerHook",
]
