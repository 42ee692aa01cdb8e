"""Several broker addresses: how they are given, ordered and shown."""

from __future__ import annotations

import json

import pytest

from rmqdelay import Settings
from rmqdelay.amqp.connections import candidate_urls
from rmqdelay.settings import SecretUrl, SettingsError, mask_url
from tests.unit.conftest import Load

A = "amqp://u:pw-a@h1:5701/%2F"
B = "amqp://u:pw-b@h2:5702/%2F"


def test_a_list_commas_and_a_json_list_in_the_environment_mean_the_same(
    monkeypatch: pytest.MonkeyPatch, load: Load
) -> None:
    assert load(url=[A, B]).urls == [A, B]
    assert load(url=f"{A}, {B}").urls == [A, B]
    monkeypatch.setenv("RMQDELAY_URL", f'["{A}", "{B}"]')
    assert load().urls == [A, B]


def test_every_password_of_a_list_is_masked(load: Load) -> None:
    shown = load(url=[A, B]).masked_url
    assert "pw-a" not in shown and "pw-b" not in shown
    assert shown.count("***") == 2
    assert mask_url(f"{A},{B}") == shown


def test_an_empty_list_is_refused(load: Load) -> None:
    with pytest.raises(ValueError, match="non-empty list"):
        load(url=[])


def test_ordered_keeps_the_order_and_shuffled_tries_each_once(load: Load) -> None:
    urls = [f"amqp://h{i}:5672/%2F" for i in range(6)]
    assert candidate_urls(load(url=urls)) == urls
    shuffled = load(url=urls, url_order="shuffled")
    orders = {tuple(candidate_urls(shuffled)) for _ in range(50)}
    assert all(sorted(o) == sorted(urls) for o in orders)
    assert len(orders) > 1


def test_urls_naming_different_vhosts_are_refused_naming_each_masked(load: Load) -> None:
    with pytest.raises(SettingsError) as info:
        load(url=[A, "amqp://u:pw-c@h3:5703/other"])
    text = str(info.value)
    assert "url names several virtual hosts" in text and "'other'" in text and "'/'" in text
    assert "pw-a" not in text and "pw-c" not in text
    # the same vhost spelled three ways is one vhost
    assert load(url=["amqp://h1", "amqp://h2/", "amqp://h3/%2F"]).vhost == "/"
    assert load(url="amqp://h1/shop,amqp://h2/shop").vhost == "shop"


def test_url_is_a_secret_shown_masked_and_raw_only_on_request() -> None:
    settings = Settings(url=[A, B], management_url="http://m:pw-m@h1:15672")
    assert isinstance(settings.url, SecretUrl) and isinstance(settings.management_url, SecretUrl)
    assert str(settings.url) == "amqp://u:***@h1:5701/%2F,amqp://u:***@h2:5702/%2F"
    assert repr(settings.management_url) == "SecretUrl('http://m:***@h1:15672')"
    assert settings.url.get_secret_value() == f"{A},{B}"
    assert settings.urls == [A, B] and settings.management_urls == ["http://m:pw-m@h1:15672"]
    assert json.loads(settings.to_json())["url"] == settings.masked_url
    # a Settings can be made again from its own fields, and from a SecretUrl
    assert Settings(url=settings.url).urls == [A, B]
    assert Settings(url=[SecretUrl(A), B]).urls == [A, B]


def test_several_management_urls_a_list_commas_or_json_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, load: Load
) -> None:
    m1, m2 = "http://a:pw1@n1:15672", "https://n2:15671/api-root"
    assert load(management_url=[m1, m2]).management_urls == [m1, m2]
    assert load(management_url=f"{m1} , {m2}").management_urls == [m1, m2]
    monkeypatch.setenv("RMQDELAY_MANAGEMENT_URL", f'["{m1}", "{m2}"]')
    assert load().management_urls == [m1, m2]
    monkeypatch.delenv("RMQDELAY_MANAGEMENT_URL")
    assert load(management_url=" ").management_url is None
    with pytest.raises(SettingsError, match=r"management_url must be http\(s\)://host:port"):
        load(management_url=[m1, "amqp://u:pw3@n3:5672"])


def test_a_copy_with_a_plain_string_still_gives_raw_urls() -> None:
    # a copy given a plain string reads it as the constructor does: a secret URL
    copied = Settings(url=A).replace(url=B)
    assert copied.urls == [B] and "pw-b" not in copied.masked_url
