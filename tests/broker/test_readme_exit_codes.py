"""The CLI reference's exit codes, run as a user would: each example value it gives
(``--delay 500y``) exits with the code the README names, in one line naming the value.

The settings are the defaults (``max_delay`` of 366 d, which the README's exit-1 example
exceeds), on the test broker under a fresh prefix; no example gets as far as sending.
"""

from __future__ import annotations

import pytest

from tests.helpers.cli import rmqdelay_env, run_cli
from tests.helpers.readme_blocks import exit_code_examples

EXAMPLES = exit_code_examples()  # tests/unit/test_readme_blocks.py: one of each code at least


@pytest.mark.parametrize(("code", "example"), EXAMPLES, ids=[e for _, e in EXAMPLES])
def test_the_readme_exit_code_examples_exit_as_it_says(
    code: int, example: str, amqp_url: str, prefix: str
) -> None:
    env = rmqdelay_env(str(amqp_url), prefix)  # no max_delay: "by default"
    result = run_cli(env, "publish", "jobs", "x", *example.split())
    said = result.stderr + result.stdout
    assert result.returncode == code, (example, result.returncode, said)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), said
    value = example.split()[1]
    assert value in lines[0], (value, said)  # refused for this value, not something else
