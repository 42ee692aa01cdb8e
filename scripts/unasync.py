"""Generate the synchronous publisher API from the asyncio one, as httpcore does.

``rmqdelay/core/publishing/aio_api.py`` declares every publisher operation once;
``rmqdelay/core/publishing/api.py`` is that file with ``async`` and ``await`` dropped and
the async names swapped for the sync ones. ``python scripts/unasync.py`` writes it;
``--check`` fails when it is out of date (``tests/unit/test_publisher_api.py`` runs it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "rmqdelay" / "core" / "publishing" / "aio_api.py"
TARGET = ROOT / "rmqdelay" / "core" / "publishing" / "api.py"

HEADER = '''"""The publisher API for synchronous code: :mod:`.aio_api` without ``async``.

GENERATED from ``aio_api.py`` by ``scripts/unasync.py``: edit that file, then run
``python scripts/unasync.py``. :class:`AbstractPublisher` is what
:class:`~rmqdelay.Publisher` and :class:`~rmqdelay.testing.InMemoryPublisher` implement.
"""
'''

# (pattern, replacement), applied in order
RULES: list[tuple[str, str]] = [
    (r"\basync def ", "def "),
    (r"\basync with ", "with "),
    (r"\bawait ", ""),
    (r"\bAbstractAsyncPublisher\b", "AbstractPublisher"),
    (r"\bAsyncPublisherProtocol\b", "PublisherProtocol"),
    (r"\bAsyncInMemoryPublisher\b", "InMemoryPublisher"),
    (r"\bAsyncPublisher\b", "Publisher"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"from asyncio code", "from synchronous code"),
]


def generate(source: str) -> str:
    """The sync module of the async ``source``: its docstring replaced, the rest rewritten."""
    docstring_end = source.index('"""', 3) + 3
    body = source[docstring_end:]
    for pattern, replacement in RULES:
        body = re.sub(pattern, replacement, body)
    return HEADER + body.lstrip("\n").join(("\n", ""))


def main(argv: list[str]) -> int:
    wanted = generate(SOURCE.read_text())
    if "--check" in argv:
        if TARGET.read_text() != wanted:
            print(f"{TARGET.relative_to(ROOT)} is out of date: run python scripts/unasync.py")
            return 1
        return 0
    TARGET.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
