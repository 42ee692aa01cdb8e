"""The two ends of the client libraries' ranges in pyproject.toml, for ``make test-deps``.

``deps_ends.py oldest`` prints pip constraints pinning each library to its lower bound
(``newest`` prints none: pip's eager upgrade then takes the newest each range allows).
``deps_ends.py --installed oldest|newest`` prints the versions installed beside it, and
fails when an ``oldest`` venv holds anything but the lower bounds.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("pika", "aio-pika", "aiormq", "pamqp", "yarl")
"""What rmqdelay imports to talk to the broker: the publishers and the worker."""


def lower_bounds(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """Each library's ``>=`` bound among the project's dependencies."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    bounds: dict[str, str] = {}
    for line in dependencies:
        found = re.match(r"\s*([A-Za-z0-9_.-]+)\s*([^;]*)", line)
        if found is None or found[1].lower() not in LIBRARIES:
            continue
        lower = re.search(r">=\s*([\w.]+)", found[2])
        if lower is None:
            sys.exit(f"deps_ends: {found[1]} has no lower bound in pyproject.toml")
        bounds[found[1].lower()] = lower[1]
    missing = set(LIBRARIES) - set(bounds)
    if missing:
        sys.exit(f"deps_ends: pyproject.toml does not declare {', '.join(sorted(missing))}")
    return bounds


def _same(installed: str, bound: str) -> bool:
    """``9.4`` is ``9.4.0``, as pip's ``==`` reads it."""

    def parts(text: str) -> list[int]:
        numbers = [int(p) for p in re.findall(r"\d+", text)]
        while numbers and numbers[-1] == 0:
            numbers.pop()
        return numbers

    return parts(installed) == parts(bound)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("end", choices=["oldest", "newest"])
    parser.add_argument("--installed", action="store_true", help="show and check the venv's")
    args = parser.parse_args(argv)
    bounds = lower_bounds()
    if not args.installed:
        if args.end == "oldest":
            print("\n".join(f"{name}=={bound}" for name, bound in bounds.items()))
        return 0
    installed = {name: metadata.version(name) for name in LIBRARIES}
    print(" ".join(f"{name} {version}" for name, version in installed.items()))
    wrong = [n for n in LIBRARIES if args.end == "oldest" and not _same(installed[n], bounds[n])]
    if wrong:
        print(f"deps_ends: not the lower bounds: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
