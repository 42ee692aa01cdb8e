"""The one settings loader: its sources (flags, ``RMQDELAY_*``, a TOML file, the defaults),
their precedence, and the words of its errors, for any mix of them (hypothesis).

The loader was checked, value for value and error for error, against the pydantic-settings
model it replaced; the wording of a wrong type or range is pinned below.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqdelay.errors import ConfigurationError
from rmqdelay.settings import Settings, SettingsError, load_settings, reveal

# values a user may give each setting, right and wrong, as text (flags, environment)
TEXT: dict[str, list[str]] = {
    "url": [
        "amqp://u:pw@h1:5672/%2F",
        "amqp://h1,amqp://h2/",
        "amqps://u:pw@h:5671/shop",
        "amqp://h1/a,amqp://h2/b",
        "amqp://h:0/",
        "http://h/",
        "amqp://h1, amqps://h2",
        '["amqp://h1", "amqp://h2"]',
        "",
    ],
    "management_url": [
        "http://m:pw@h:15672",
        " ",
        "amqp://h",
        "https://h:99999",
        "http://a,http://b",
    ],
    "prefix": ["rmqdelay", "app-1", "a.b", "amq", "amq.x", "", "with space"],
    "connection_name": ["svc", ""],
    "url_order": ["ordered", "shuffled", "Shuffled", "random"],
    "queue_type": ["quorum", "classic", "stream"],
    "queue_leader_locator": ["balanced", "client-local", "none", "random"],
    "resolution": ["10ms", "1s", "0.01", "1", "0", "-5ms", "1.5ms", "soon", "1us"],
    "max_delay": ["1h", "30d", "100y", "0", "5ms", "nope"],
    "radix": ["2", "16", "17", "1", "x", "08", " 4", "4.0"],
    "positions": ["1", "3", "0", "9", "-1", "many"],
    "delivery_limit": ["1", "20", "0", "-3"],
    "quorum_group_size": ["1", "3", "0"],
    "max_destination_length": ["100", "1", "0", "200"],
    "schedule_journal": ["true", "false", "1", "0", "yes", "False", "maybe"],
    "journal_bodies": ["true", "0", "off", "2"],
    "confirm_timeout": ["30", "0.5", "0", "-1", "1e3", "fast", "inf"],
    "named_tiers": ['["15m"]', "1s", "[]"],
    "destinations": ['["a"]', "a"],
}
# values of a TOML file: its own types too
TOML_VALUES: dict[str, list[Any]] = {
    **{k: list(v) for k, v in TEXT.items()},
    "radix": [2, 16, 17, True, 8.0],
    "positions": [3, 0],
    "resolution": [10, 0.01, "10ms", 0],
    "schedule_journal": [True, False, 1],
    "confirm_timeout": [5, 0.5, 0, True],
    "url": ["amqp://h1/", ["amqp://h1", "amqp://h2"], []],
    "named_tiers": [["15m"], []],
    "unknown_key": [1],
}


def _toml_text(table: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in table.items())


def _choices(pools: dict[str, list[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(sorted(pools)), st.integers(0, 99), max_size=4).map(
        lambda picks: {k: pools[k][i % len(pools[k])] for k, i in picks.items()}
    )


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Exactly these ``RMQDELAY_*`` variables (the test runner's own put aside)."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("RMQDELAY_")}
    with mock.patch.dict(os.environ, {**clean, **values}, clear=True):
        yield


def _outcome(load: Any, config: Path | None, flags: dict[str, Any]) -> Any:
    try:
        return load(config, **flags)
    except Exception as exc:  # compared below, type and words
        return exc


def _values(loaded: Settings) -> dict[str, Any]:
    found = {f.name: getattr(loaded, f.name) for f in fields(Settings)}
    found.update(url=reveal(loaded.url), masked_url=loaded.masked_url, layout=loaded.layout)
    found.update(urls=loaded.urls, management_urls=loaded.management_urls)
    return found


LISTS = {"named_tiers", "destinations", "dashboard_worker_metrics"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    env=_choices(TEXT),
    toml=st.none() | _choices(TOML_VALUES),
    flags=_choices({"url": TEXT["url"], "prefix": TEXT["prefix"]}),
    env_case=st.sampled_from([str.upper, str.lower]),
)
def test_each_setting_is_read_from_its_highest_source_alike(
    env: dict[str, str], toml: dict[str, Any] | None, flags: dict[str, Any], env_case: Any
) -> None:
    """Flags over the environment over the file over the defaults; a value reads the same
    from any source (a list in the environment is JSON), and so does its error."""
    environment = {env_case("RMQDELAY_" + k): v for k, v in env.items()}
    with tempfile.TemporaryDirectory() as folder, _environment(environment):
        config = None
        if toml is not None:
            config = Path(folder) / "rmqdelay.toml"
            config.write_text(_toml_text(toml))
        loaded = _outcome(load_settings, config, flags)
    try:
        from_env = {k: json.loads(v) if k in LISTS else v for k, v in env.items()}
    except json.JSONDecodeError:
        assert isinstance(loaded, ConfigurationError), loaded
        assert "a list in the environment is written as JSON" in str(loaded)
        return
    with _environment({}):
        expected = _outcome(
            lambda _, **given: Settings(**given), None, {**(toml or {}), **from_env, **flags}
        )
    if isinstance(expected, Exception):
        assert type(loaded) is type(expected) and str(loaded) == str(expected)
    else:
        assert not isinstance(loaded, Exception), loaded
        assert _values(loaded) == _values(expected)


def test_plain_settings_are_read_from_every_source(tmp_path: Path) -> None:
    config = tmp_path / "rmqdelay.toml"
    config.write_text('prefix = "from-file"\nradix = 4\nresolution = "100ms"\nurl = "amqp://f/"\n')
    env = {"RMQDELAY_PREFIX": "from-env", "RMQDELAY_SCHEDULE_JOURNAL": "false"}
    with _environment(env):
        loaded = load_settings(config, url="amqp://u:secret@flag:5672/%2F")
    # flags over the environment over the file over the defaults
    assert (loaded.urls, loaded.prefix, loaded.radix) == (
        ["amqp://u:secret@flag:5672/%2F"],
        "from-env",
        4,
    )
    assert (loaded.resolution, loaded.schedule_journal, loaded.queue_type) == (100, False, "quorum")
    assert "secret" not in repr(loaded) and "secret" not in loaded.masked_url


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (
            {"radix": "x"},
            "radix: Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            {"radix": 4.5},
            "radix: Input should be a valid integer, got a number with a fractional part",
        ),
        ({"url_order": "random"}, "url_order: Input should be 'ordered' or 'shuffled'"),
        (
            {"queue_leader_locator": "x"},
            "queue_leader_locator: Input should be 'balanced', 'client-local' or 'none'",
        ),
        ({"delivery_limit": "0"}, "delivery_limit: Input should be greater than or equal to 1"),
        ({"confirm_timeout": "0"}, "confirm_timeout: Input should be greater than 0"),
        (
            {"confirm_timeout": "fast"},
            "confirm_timeout: Input should be a valid number, unable to parse string as a number",
        ),
        ({"dashboard_port": 70000}, "dashboard_port: Input should be less than or equal to 65535"),
        (
            {"schedule_journal": "maybe"},
            "schedule_journal: Input should be a valid boolean, unable to interpret input",
        ),
        ({"destinations": "a"}, "destinations: Input should be a valid list"),
        ({"named_tiers": ["1s", "x"]}, "named_tiers.1: cannot read duration 'x'"),
        ({"prefix": 5}, "prefix: Input should be a valid string"),
        ({"bogus": 1}, "bogus: Extra inputs are not permitted"),
        ({"dashboard_user": "ops"}, "settings: dashboard_user and dashboard_password go together"),
    ],
)
def test_a_wrong_value_is_refused_in_the_words_users_know(given: dict[str, Any], said: str) -> None:
    with _environment({}), pytest.raises(SettingsError) as info:
        Settings(**given)
    assert str(info.value).startswith("invalid settings: ") and said in str(info.value)
    where = ".".join(map(str, info.value.errors()[0]["loc"])) or "settings"
    assert where == said.split(": ")[0]


def test_every_setting_is_declared_once_with_a_description() -> None:
    """The settings reference is generated from these fields."""
    declared = fields(Settings)
    assert len(declared) == 35
    assert all(len(f.metadata["description"]) > 10 for f in declared)
    with _environment({}):
        assert Settings().as_dict().keys() == {f.name for f in declared}
