"""The ``rmqdelay`` command line (click). Each command group is a module; ``app`` joins
them, and ``main`` is the console script."""

from .app import app, main

__all__ = ["app", "main"]
