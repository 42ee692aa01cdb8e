"""Several broker addresses: how they are given, ordered and shown."""

from __future__ import annotations

import pytest

from rmqdelay import Settings
from rmqdelay.amqp.connections import candidate_urls
from rmqdelay.settings import mask_url

A = "amqp://u:pw-a@h1:5701/%2F"
B = "amqp://u:pw-b@h2:5702/%2F"


def test_a_list_commas_and_a_json_list_in_the_environment_mean_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings(url=[A, B]).urls == [A, B]
    assert Settings(url=f"{A}, {B}").urls == [A, B]
    monkeypatch.setenv("RMQDELAY_URL", f'["{A}", "{B}"]')
    assert Settings().urls == [A, B]


def test_every_password_of_a_list_is_masked() -> None:
    shown = Settings(url=[A, B]).masked_url
    assert "pw-a" not in shown and "pw-b" not in shown
    assert shown.count("***") == 2
    assert mask_url(f"{A},{B}") == shown


def test_an_empty_list_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty list"):
        Settings(url=[])


def test_ordered_keeps_the_order_and_shuffled_tries_each_once() -> None:
    urls = [f"amqp://h{i}:5672/%2F" for i in range(6)]
    assert candidate_urls(Settings(url=urls)) == urls
    shuffled = Settings(url=urls, url_order="shuffled")
    orders = {tuple(candidate_urls(shuffled)) for _ in range(50)}
    assert all(sorted(o) == sorted(urls) for o in orders)
    assert len(orders) > 1
