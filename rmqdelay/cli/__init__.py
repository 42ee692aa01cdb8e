"""The ``rmqdelay`` command line. Each command group is a module; ``app`` joins them."""

from .app import app, main

__all__ = ["app", "main"]
