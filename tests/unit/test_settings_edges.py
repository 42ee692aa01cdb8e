"""Settings a user gets wrong: a clear message naming what to fix, and no password shown."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rmqdelay import DelayError
from rmqdelay.core.plan import check_max_delay
from rmqdelay.settings import SettingsError
from tests.unit.conftest import Load


def test_a_bad_field_does_not_print_the_password_of_the_url(load: Load) -> None:
    secret = uuid.uuid4().hex
    with pytest.raises(SettingsError) as info:
        load(url=f"amqp://u:{secret}@h/", radix=99)
    assert "radix must be from 2 to 16" in str(info.value)
    assert secret not in str(info.value) and secret not in repr(info.value)


@pytest.mark.parametrize("url", ["not a url", "http://foo", "amqp:///nohost"])
def test_a_url_that_is_not_amqp_is_refused_naming_the_form(url: str, load: Load) -> None:
    with pytest.raises(SettingsError, match=r"is not an AMQP URL: give amqp://"):
        load(url=url)


def test_every_url_of_a_list_is_checked_and_shown_masked(load: Load) -> None:
    secret = uuid.uuid4().hex
    with pytest.raises(SettingsError) as info:
        load(url=f"amqp://g:{secret}@h:5999/,http://g:{secret}@h/")
    assert "http://g:***@h/" in str(info.value) and secret not in str(info.value)


def test_a_prefix_with_dots_is_refused(load: Load) -> None:
    with pytest.raises(SettingsError, match="no dots"):
        load(prefix="a.b")


def test_malformed_toml_names_the_file(tmp_path: Path, load: Load) -> None:
    config = tmp_path / "rmqdelay.toml"
    config.write_text("prefix = [oops\n")
    with pytest.raises(ValueError, match=r"rmqdelay.toml' is not valid TOML"):
        load(config)


def test_a_huge_delay_shows_the_limit_not_the_number(load: Load) -> None:
    layout = load(max_delay="1h").layout
    with pytest.raises(DelayError) as info:
        check_max_delay(layout, int(1e300))
    assert "over a century" in str(info.value) and "1h" in str(info.value)
    assert len(str(info.value)) < 200
