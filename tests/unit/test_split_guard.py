"""tests/conftest.py keeps the unit/broker split honest: a unit test that needs the broker
fixture, directly or through another fixture, fails before any broker is looked for."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"


@pytest.fixture
def tree(pytester: pytest.Pytester) -> pytest.Pytester:
    """A copy of the tests' conftest, and a broker fixture that must never be set up."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.mkdir("tests")
    pytester.mkdir("tests/unit")
    return pytester


def test_a_unit_test_that_needs_the_broker_fails_and_says_why(tree: pytest.Pytester) -> None:
    tree.makepyfile(
        **{
            "tests/unit/test_sneaky": """
                import pytest

                @pytest.fixture
                def queue_name(amqp_url):
                    return "q"

                def test_direct(broker):
                    pass

                def test_indirect(queue_name):
                    pass

                def test_fine(prefix):
                    assert prefix.startswith("t-fine-")
            """
        }
    )
    result = tree.runpytest_inprocess("-p", "no:cacheprovider", "tests/unit")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*test_direct is a unit test (tests/unit) but needs the broker fixture "
            "(through broker)*",
            "*test_indirect is a unit test (tests/unit) but needs the broker fixture "
            "(through queue_name -> amqp_url -> broker)*",
        ]
    )
    assert "no RabbitMQ broker" not in result.stdout.str()  # never looked for one
