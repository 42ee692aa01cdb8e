"""The README tests in tests/broker have blocks to run: the README parses as they expect."""

from __future__ import annotations

from readme_blocks import PYTHON_BLOCKS, RUNNABLE_SH


def test_readme_has_examples() -> None:
    assert len(PYTHON_BLOCKS) >= 2


def test_the_quickstart_commands_are_among_the_runnable_blocks() -> None:
    assert any("rmqdelay publish" in b and "rmqdelay consume" in b for b in RUNNABLE_SH), (
        "the quickstart's publish/consume block is no longer picked up by this test"
    )
