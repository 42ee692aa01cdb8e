"""``python -m bench [command] ...``: entry point of the benchmark suite.

Commands:
  (none)  the whole suite (``bench.suite``): ``python -m bench``, ``python -m bench --quick``,
          ``python -m bench --only publish,e2e --scale-messages 0`` (``--help`` lists flags)
  report  plots and the Performance page (docs/performance.md) from bench/results/*.json
  startup how fast ``rmqdelay`` starts (``bench.startup``): ``python -m bench startup``
  compare this tree's publish and worker figures against a git revision's, side by side
          (``bench.compare``): ``python -m bench compare main``
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("help", "commands"):
        print(__doc__)
        return 0
    command, rest = (argv[0], argv[1:]) if argv and not argv[0].startswith("-") else ("", argv)
    if command == "":
        from bench.suite import main as suite_main

        return suite_main(rest)
    if command == "compare":
        from bench.compare import main as compare_main

        return compare_main(rest)
    if command == "startup":
        from bench.startup import main as startup_main

        return startup_main(rest)
    if command == "report":
        from bench.report import main as report_main

        return report_main(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
