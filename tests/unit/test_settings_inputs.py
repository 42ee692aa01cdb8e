"""Settings given wrong: refused when read, naming the setting, never the password."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rmqdelay import ConfigurationError
from rmqdelay.settings import SettingsError
from tests.unit.conftest import Load


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("url", "amqp://u:{s}@h:abc/"),
        ("url", "amqp://u:{s}@h:99999/"),
        ("url", "amqp://u:{s}@h:0/"),
        ("url", "amqp://u:p@h:5672/,amqp://u:{s}@h2:x/"),
        ("management_url", "http://u:{s}@h:abc"),  # was http.client.InvalidURL, a traceback
    ],
)
def test_a_bad_port_is_refused_when_read_and_masked(field: str, url: str, load: Load) -> None:
    secret = uuid.uuid4().hex
    with pytest.raises(SettingsError) as info:
        load(**{field: url.format(s=secret)})
    assert f"{field} " in str(
        info.value
    ) and "has a bad port: give a number from 1 to 65535" in str(info.value)
    assert secret not in str(info.value) and secret not in repr(info.value)


@pytest.mark.parametrize("field", ["tls_ca_file", "tls_cert_file", "tls_key_file"])
def test_a_missing_tls_file_is_named(field: str, tmp_path: Path, load: Load) -> None:
    missing = tmp_path / "nowhere.pem"
    with pytest.raises(SettingsError, match=rf"{field} '{missing}' is not a file"):
        load(**{field: missing})
    present = tmp_path / "here.pem"
    present.write_text("")
    assert getattr(load(**{field: present}), field) == present


def test_a_list_in_the_environment_that_is_not_json_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, load: Load
) -> None:
    monkeypatch.setenv("RMQDELAY_NAMED_TIERS", "1s")
    with pytest.raises(ConfigurationError, match=r"cannot read RMQDELAY_NAMED_TIERS: .* JSON"):
        load()
    monkeypatch.setenv("RMQDELAY_NAMED_TIERS", '["1s", "1m"]')
    assert load().named_tiers == [60_000, 1_000]
