"""The README's code blocks and promised figures, as the README tests read them (no
broker needed here).

``python`` blocks run as scripts; an ``sh`` block runs when every command in it is
``rmqdelay ...`` (not a long-running ``rmqdelay worker`` or ``rmqdelay dashboard``) or
an ``export`` of an ``RMQDELAY_*`` variable. The worker's reconnect pauses and the CLI's
exit codes are read from the prose, so that tests can hold the code to them.
"""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
_TEXT = README.read_text()
PYTHON_BLOCKS: list[str] = re.findall(r"```python\n(.*?)```", _TEXT, flags=re.S)
SH_BLOCKS: list[str] = re.findall(r"```sh\n(.*?)```", _TEXT, flags=re.S)


def commands(block: str) -> list[str]:
    """The block's commands: its lines without comments or blanks."""
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line]


LONG_RUNNING = ("rmqdelay worker ", "rmqdelay dashboard")
"""Commands that run until stopped: a README example of them is not run."""


def runnable(block: str) -> bool:
    found = commands(block)
    return bool(found) and all(
        (c.startswith("rmqdelay ") and not c.startswith(LONG_RUNNING))
        or c.startswith("export RMQDELAY_")
        for c in found
    )


RUNNABLE_SH: list[str] = [b for b in SH_BLOCKS if runnable(b)]


_FLAT = " ".join(_TEXT.split())  # the prose with its line breaks undone


def reconnect_pauses() -> tuple[float, float]:
    """The worker's reconnect pauses as "Running workers" states them: (first, longest)."""
    found = re.search(r"reconnects with backoff \(([\d.]+) s doubling up to ([\d.]+) s", _FLAT)
    assert found, "the README no longer says 'reconnects with backoff (X s doubling up to Y s'"
    return float(found[1]), float(found[2])


def exit_codes() -> dict[int, str]:
    """The CLI reference's exit codes, each with the words that say when it is given."""
    found = re.search(r"Exit codes are the same for every command: (.*?) Errors are", _FLAT)
    assert found, "the README no longer has 'Exit codes are the same for every command:'"
    clauses = re.findall(r"\*\*(\d+)\*\* (.*?)(?=\*\*\d|$)", found[1])
    return {int(code): words for code, words in clauses}


def exit_code_examples() -> list[tuple[int, str]]:
    """The option values the exit codes give as examples (``--delay 500y``), with their code."""
    return [
        (code, example)
        for code, words in exit_codes().items()
        for example in re.findall(r"`(--(?:delay|at) [^`]+)`", words)
    ]
