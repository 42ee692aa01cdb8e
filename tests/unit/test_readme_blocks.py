"""The README and the docs parse as the block tests expect, and their promised figures are
the code's."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from rmqdelay.cli import app
from rmqdelay.worker.reconnect import RECONNECT_FIRST_S, RECONNECT_MAX_S, reconnect_delay
from tests.helpers.readme_blocks import (
    PYTHON_BLOCKS,
    README,
    RUNNABLE_SH,
    TEXT,
    exit_code_examples,
    exit_codes,
    reconnect_pauses,
)

PYPROJECT = README.parent / "pyproject.toml"


def test_readme_has_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 2
    assert any(b.document == "README.md" for b in PYTHON_BLOCKS)


def test_the_quickstart_commands_are_among_the_runnable_blocks() -> None:
    quickstart = [b for b in RUNNABLE_SH if "rmqdelay publish" in b.code]
    assert any("rmqdelay consume" in b.code for b in quickstart if b.document == "README.md"), (
        "the quickstart's publish/consume block is no longer picked up by this test"
    )


def test_the_reconnect_pauses_are_the_workers() -> None:
    first, longest = reconnect_pauses()
    assert (first, longest) == (RECONNECT_FIRST_S, RECONNECT_MAX_S)
    # "jittered between half and one and a half times that, and never over 15 s"
    assert "between half and one and a half times that, and never over" in " ".join(TEXT.split())
    assert reconnect_delay(0, 0.0) == first / 2
    assert reconnect_delay(0, 0.5) == first
    assert reconnect_delay(1, 0.5) == 2 * first  # doubling
    pauses = [reconnect_delay(n, j / 100) for n in range(50) for j in range(100)]
    assert max(pauses) == longest  # reached, never passed


def test_the_exit_codes_give_examples_of_each_kind() -> None:
    assert set(exit_codes()) >= {1, 2, 130}
    examples = exit_code_examples()
    assert {code for code, _ in examples} == {1, 2}, examples


@pytest.mark.parametrize(
    "example", [example for code, example in exit_code_examples() if code == 2]
)
def test_the_exit_2_examples_exit_2_before_connecting(example: str) -> None:
    # the broker tests run every example as a user does (tests/broker/test_readme_exit_codes.py)
    result = CliRunner().invoke(
        app,
        ["publish", "jobs", "x", *example.split()],
        env={"RMQDELAY_URL": "amqp://guest:guest@127.0.0.1:1/%2F"},  # never tried
    )
    assert result.exit_code == 2, result.output
    option, value = example.split()
    assert result.output.startswith("error: "), result.output
    assert option in result.output and repr(value) in result.output, result.output


def test_make_test_says_which_tests_it_runs() -> None:
    addopts = re.search(r"^addopts = (.*)$", PYPROJECT.read_text(), flags=re.M)
    # what the README's wording rests on
    assert addopts and "-m 'not cluster and not browser'" in addopts[1]
    # each "make test  # ..." line of the README and the docs, with the comment lines that
    # continue it: the README's two commands, the tutorial, Development
    said = re.findall(r"^make test +#.*(?:\n +#.*)*", TEXT, flags=re.M)
    assert len(said) >= 3, said
    assert re.search(r"^make test +#", README.read_text(), flags=re.M), "README: make test"
    for words in said:
        assert "whole" not in words, words
        assert "but the cluster and browser ones" in words or "but tests/cluster" in words, words
        assert "make cluster-test and make test-browser" in words, words
