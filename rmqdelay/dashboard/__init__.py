"""``rmqdelay dashboard``: the schedule, the tiers and the parked messages in a browser.

The top layer: it uses the publishers, the parked queue, the status and the settings,
and nothing below imports it. Its libraries (Starlette, uvicorn, Jinja2) come with the
``dashboard`` extra, so ``pip install rmqdelay`` and the publishers stay without them.
"""

READ_ONLY = "shows everything and refuses every action (cancel, reschedule, replay, ...)"
"""What ``--read-only`` (``dashboard_read_only``) does, in the words the help, the
dashboard's refusal and the settings' reference all say."""
