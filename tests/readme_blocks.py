"""The README's code blocks, as the README tests read them (no broker needed here).

``python`` blocks run as scripts; an ``sh`` block runs when every command in it is
``rmqdelay ...`` (not a long-running ``rmqdelay worker``) or an ``export`` of an
``RMQDELAY_*`` variable.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
_TEXT = README.read_text()
PYTHON_BLOCKS: list[str] = re.findall(r"```python\n(.*?)```", _TEXT, flags=re.S)
SH_BLOCKS: list[str] = re.findall(r"```sh\n(.*?)```", _TEXT, flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands: its lines without comments or blanks."""
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line]


def runnable(block: str) -> bool:
    found = commands(block)
    return bool(found) and all(
        (c.startswith("rmqdelay ") and not c.startswith("rmqdelay worker "))
        or c.startswith("export RMQDELAY_")
        for c in found
    )


RUNNABLE_SH: list[str] = [b for b in SH_BLOCKS if runnable(b)]
