"""Where the management API is looked for, and as whom (no broker needed)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rmqdelay import Settings
from rmqdelay.amqp.management import management_location


@pytest.mark.parametrize(
    ("amqp_url", "management_url", "expected"),
    [
        ("amqp://u:p@rabbit:5673/%2F", None, ("http://rabbit:15672", "u", "p")),
        ("amqps://u:p@rabbit/v", None, ("https://rabbit:15672", "u", "p")),
        ("amqp://[::1]:5672/%2F", None, ("http://[::1]:15672", "guest", "guest")),
        (
            "amqp://u:p@h/%2F",
            "https://m.example:8443/rmq/",
            ("https://m.example:8443/rmq", "u", "p"),
        ),
        (
            "amqp://u:p@h/%2F",
            "http://admin:s%40cret@m:15673",
            ("http://m:15673", "admin", "s@cret"),
        ),
    ],
)
def test_management_location(
    amqp_url: str, management_url: str | None, expected: tuple[str, str, str]
) -> None:
    assert management_location(amqp_url, management_url) == expected


def test_setting_is_checked_and_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RMQDELAY_MANAGEMENT_URL", raising=False)
    assert Settings().management_url is None
    assert Settings(management_url="").management_url is None
    with pytest.raises(ValidationError) as info:
        Settings(management_url="amqp://u:secretpw@h:5672")
    message = info.value.errors()[0]["msg"]
    assert "http(s)://host:port" in message and "secretpw" not in message
