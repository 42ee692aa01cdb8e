"""Consumer workers: the app users write, the runner that consumes, and settling.

``app`` holds the handler registry; ``runner`` the connection loop, slots and shutdown;
``settle`` acks, retries and parks at least once; ``logs`` and ``metrics`` report.
"""

from ..errors import WorkerError
from .app import RunOptions, Worker
from .runner import RunningWorker

__all__ = ["RunOptions", "RunningWorker", "Worker", "WorkerError"]
