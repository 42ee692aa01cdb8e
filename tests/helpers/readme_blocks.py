"""The code blocks and promised figures of the README and the docs site (docs/**/*.md), as
the tests read them (no broker needed here).

Every fenced block is one of :data:`LANGUAGES`. ``python`` blocks run as scripts; an
``sh`` (or ``bash``) block runs when every command in it is ``rmqdelay ...`` (not a
long-running ``rmqdelay worker`` or ``rmqdelay dashboard``) or an ``export`` of an
``RMQDELAY_*`` variable; ``toml`` blocks are loaded as settings files. A block that
cannot run as it stands is written as ``text`` (a synopsis, a command for another tool),
or is in a document that a test of its own runs in order (:data:`OWN_RUNNER`). The
worker's reconnect pauses and the CLI's exit codes are read from the prose, so that tests
can hold the code to them.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DOCUMENTS: list[Path] = [README, *sorted(DOCS.rglob("*.md"))]

OWN_RUNNER = {"docs/migration.md": "tests/broker/test_migration.py"}
"""Documents whose blocks build on each other, run in order by their own test."""

LANGUAGES = {
    "python": "run as a script (tests/broker/test_readme.py)",
    "sh": "run when runnable() (tests/broker/test_readme_shell.py)",
    "bash": "as sh",
    "toml": "loaded as a settings file (tests/unit/test_docs.py)",
    "text": "not run: synopses, output, other tools' commands",
    "diff": "not run: a change to make",
    "": "not run",
}
"""Every language a block may have, and what the tests do with it."""

_FENCE = re.compile(r"^([ \t]*)```(\S*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", flags=re.S | re.M)


@dataclass(frozen=True)
class Block:
    document: str  # relative to the repository, e.g. docs/guides/workers.md
    line: int
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"


def _blocks(path: Path) -> list[Block]:
    text = path.read_text(encoding="utf-8")
    name = path.relative_to(ROOT).as_posix()
    return [
        Block(
            name,
            text.count("\n", 0, m.start()) + 1,
            m[2],
            textwrap.dedent(m[3]) if m[1] else m[3],
        )
        for m in _FENCE.finditer(text)
    ]


BLOCKS: list[Block] = [b for path in DOCUMENTS for b in _blocks(path)]
_OURS = [b for b in BLOCKS if b.document not in OWN_RUNNER]
PYTHON_BLOCKS: list[Block] = [b for b in _OURS if b.language == "python"]
SH_BLOCKS: list[Block] = [b for b in _OURS if b.language in ("sh", "bash")]
TOML_BLOCKS: list[Block] = [b for b in _OURS if b.language == "toml"]


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


RUNNABLE_SH: list[Block] = [b for b in SH_BLOCKS if runnable(b.code)]

TEXT = "\n".join(path.read_text(encoding="utf-8") for path in DOCUMENTS)
"""The README and every page of the docs, one after the other."""
_FLAT = " ".join(TEXT.split())  # the prose with its line breaks undone


def reconnect_pauses() -> tuple[float, float]:
    """The worker's reconnect pauses as "Running workers" states them: (first, longest)."""
    found = re.search(r"reconnects with backoff \(([\d.]+) s doubling up to ([\d.]+) s", _FLAT)
    assert found, "the docs no longer say 'reconnects with backoff (X s doubling up to Y s'"
    return float(found[1]), float(found[2])


def exit_codes() -> dict[int, str]:
    """The CLI reference's exit codes, each with the words that say when it is given."""
    found = re.search(r"Exit codes are the same for every command: (.*?) Errors are", _FLAT)
    assert found, "the docs no longer have 'Exit codes are the same for every command:'"
    clauses = re.findall(r"\*\*(\d+)\*\* (.*?)(?=\*\*\d|$)", found[1])
    return {int(code): words for code, words in clauses}


def exit_code_examples() -> list[tuple[int, str]]:
    """The option values the exit codes give as examples (``--delay 500y``), with their code."""
    return [
        (code, example)
        for code, words in exit_codes().items()
        for example in re.findall(r"`(--(?:delay|at) [^`]+)`", words)
    ]
