"""What a command prints: the consoles, a result as JSON, and tables.

Every command prints the same way. A line is never wrapped or cut by rich (into a pipe
rich would wrap at 80 columns), and a table is rich's box drawing only on a terminal:
into a pipe or a file it is plain aligned columns, which ``cut``, ``awk`` and ``grep``
read. ``FORCE_COLOR=1`` (rich's own switch) asks for the terminal's table anywhere.
``--json`` prints the result as JSON: one object, or one object per line for a command
that answers with several (``JSON_OBJECT`` and ``JSON_LINES`` say which in the help).

rich is imported when something is printed, not when a command module loads.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

__all__ = [
    "JSON_LINES",
    "JSON_OBJECT",
    "Cell",
    "aligned",
    "err",
    "out",
    "print_json",
    "print_table",
    "rich_table",
    "text",
]

JSON_OBJECT = "Print the result as JSON: one object."
JSON_LINES = "Print the result as JSON: one object per line."

Cell = str | tuple[str, str]
"""A table's cell: its text, or its text and a rich style for the terminal."""


@functools.cache
def err() -> Console:
    """The console for errors and notes, on stderr (made on first use: rich is not cheap)."""
    from rich.console import Console

    # emoji off: ':b:' in a user's input (worker a:b:c) must not print as an emoji
    return Console(stderr=True, soft_wrap=True, emoji=False)


@functools.cache
def out(*, emoji: bool = True) -> Console:
    """The console for a command's output on stdout, lines never wrapped; ``emoji=False``
    where ids are the user's (no ':smile:' emoji)."""
    from rich.console import Console

    return Console(emoji=emoji, soft_wrap=True)


def print_json(data: Any) -> None:
    """One JSON object on one line (``--json``)."""
    print(json.dumps(data, separators=(",", ":")), flush=True)


def aligned(titles: Sequence[str], widths: Sequence[int], right: Iterable[str]) -> Any:
    """The format of one line of columns two spaces apart, the ``right`` ones to the
    right: ``aligned(...)(*cells)`` (a line may end in spaces: strip it)."""
    shown = set(right)
    return "  ".join(
        f"{{:{'>' if t in shown else '<'}{w}}}" for t, w in zip(titles, widths, strict=True)
    ).format


def plain_table(
    titles: Sequence[str], rows: Sequence[Sequence[str]], right: Iterable[str] = ()
) -> Iterator[str]:
    """The rows as aligned columns under a title line and a rule."""
    widths = [max([len(t), *(len(row[i]) for row in rows)]) for i, t in enumerate(titles)]
    line = aligned(titles, widths, right)
    yield line(*titles).rstrip()
    yield line(*("-" * w for w in widths)).rstrip()
    for row in rows:
        yield line(*row).rstrip()


def print_table(
    titles: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    title: str | None = None,
    caption: str | None = None,
    right: Iterable[str] = (),
    console: Console | None = None,
) -> None:
    """A table: rich's on a terminal, else plain columns with the title above and the
    caption below. Cells are plain text (escaped for rich here)."""
    console = console or out(emoji=False)
    rows = list(rows)
    right = set(right)
    if not console.is_terminal:
        texts = [[c if isinstance(c, str) else c[0] for c in row] for row in rows]
        lines = [*([title] if title else []), *plain_table(titles, texts, right)]
        lines += [caption] if caption else []
        console.file.write("\n".join(lines) + "\n")
        return
    console.print(rich_table(titles, rows, title=title, caption=caption, right=right))


def rich_table(
    titles: Sequence[str],
    rows: Iterable[Sequence[Cell]],
    *,
    title: str | None = None,
    caption: str | None = None,
    right: Iterable[str] = (),
) -> Table:
    """The table rich draws on a terminal (``status --watch`` redraws it live)."""
    from rich.table import Table

    right = set(right)
    table = Table(title=title, caption=caption)
    for name in titles:
        table.add_column(name, justify="right" if name in right else "left")
    for row in rows:
        table.add_row(*map(text, row))
    return table


def text(cell: Cell) -> Text:
    """A cell as rich prints it: the text as is (no markup), in its style."""
    from rich.text import Text

    return Text(cell) if isinstance(cell, str) else Text(cell[0], style=cell[1])
