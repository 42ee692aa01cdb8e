"""The light loader of ``rmqdelay publish`` against the model's: the same sources, the same
precedence, the same values and the same errors, for any mix of flags, environment and
TOML file (hypothesis), and it is light where it can be."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqdelay.settings import Settings, load_settings, reveal
from rmqdelay.settings_light import LightSettings, load_light_settings

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


def _values(loaded: Settings | LightSettings) -> dict[str, Any]:
    fields = {
        name: getattr(loaded, name)
        for name in LightSettings.__dataclass_fields__
        if name not in ("url", "management_url")
    }
    fields["named_tiers"] = list(fields["named_tiers"])
    fields["destinations"] = list(fields["destinations"])
    fields["urls"] = loaded.urls
    fields["management_urls"] = loaded.management_urls
    fields["masked_url"] = loaded.masked_url
    fields["layout"] = loaded.layout
    return fields


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    env=_choices(TEXT),
    toml=st.none() | _choices(TOML_VALUES),
    flags=_choices({"url": TEXT["url"], "prefix": TEXT["prefix"]}),
    env_case=st.sampled_from([str.upper, str.lower]),
)
def test_the_light_loader_gives_what_the_model_gives(
    env: dict[str, str], toml: dict[str, Any] | None, flags: dict[str, Any], env_case: Any
) -> None:
    environment = {env_case("RMQDELAY_" + k): v for k, v in env.items()}
    with tempfile.TemporaryDirectory() as folder, _environment(environment):
        config = None
        if toml is not None:
            config = Path(folder) / "rmqdelay.toml"
            config.write_text(_toml_text(toml))
        model = _outcome(load_settings, config, flags)
        light = _outcome(load_light_settings, config, flags)
    if isinstance(model, Exception):
        assert type(light) is type(model) and str(light) == str(model)
    else:
        assert not isinstance(light, Exception), light
        assert _values(light) == _values(model)


def test_plain_settings_are_read_light_from_every_source(tmp_path: Path) -> None:
    config = tmp_path / "rmqdelay.toml"
    config.write_text('prefix = "from-file"\nradix = 4\nresolution = "100ms"\nurl = "amqp://f/"\n')
    env = {"RMQDELAY_PREFIX": "from-env", "RMQDELAY_SCHEDULE_JOURNAL": "false"}
    with _environment(env):
        light = load_light_settings(config, url="amqp://u:secret@flag:5672/%2F")
        model = load_settings(config, url="amqp://u:secret@flag:5672/%2F")
    assert isinstance(light, LightSettings)
    # flags over the environment over the file over the defaults
    assert (light.urls, light.prefix, light.radix) == (
        ["amqp://u:secret@flag:5672/%2F"],
        "from-env",
        4,
    )
    assert (light.resolution, light.schedule_journal, light.queue_type) == (100, False, "quorum")
    assert _values(light) == _values(model)
    assert reveal(model.url) == light.url
    assert "secret" not in repr(light) and "secret" not in light.masked_url


@pytest.mark.parametrize(
    ("env", "flags"),
    [
        ({"RMQDELAY_NAMED_TIERS": '["15m"]'}, {}),  # a list: the model reads it
        ({}, {"url": ["amqp://h1", "amqp://h2"]}),
        ({"RMQDELAY_URL": "amqp://a", "rmqdelay_url": "amqp://b"}, {}),  # two spellings
    ],
)
def test_what_is_not_plain_is_read_by_the_model(env: dict[str, str], flags: dict[str, Any]) -> None:
    with _environment(env):
        assert isinstance(load_light_settings(**flags), Settings)
