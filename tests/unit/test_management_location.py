"""Where the management API is looked for, and as whom (no broker needed)."""

from __future__ import annotations

import pytest

from rmqdelay import Settings
from rmqdelay.amqp.management import (
    ManagementApi,
    management_location,
    management_locations,
    same_cluster,
)
from rmqdelay.settings import SettingsError


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
    with pytest.raises(SettingsError) as info:
        Settings(management_url="amqp://u:secretpw@h:5672")
    message = info.value.errors()[0]["msg"]
    assert "http(s)://host:port" in message and "secretpw" not in message


def test_several_locations_each_amqp_host_or_each_management_url_in_order() -> None:
    amqp = ["amqp://u:p1@n1:5711/%2F", "amqp://u:p2@n2:5712/%2F", "amqp://u:p3@n1:5713/%2F"]
    # the default: each AMQP host on :15672 once, with that URL's credentials
    assert management_locations(amqp) == [
        ("http://n1:15672", "u", "p1"),
        ("http://n2:15672", "u", "p2"),
    ]
    # given ones, in order: their own credentials, else those of the AMQP URL of their host
    given = ["http://n2:15712", "http://admin:pm@n9:15719", "http://n7:15717"]
    assert management_locations(amqp, given) == [
        ("http://n2:15712", "u", "p2"),
        ("http://n9:15719", "admin", "pm"),
        ("http://n7:15717", "u", "p1"),
    ]


def test_the_api_takes_only_the_vhost_from_the_amqp_urls() -> None:
    api = ManagementApi(
        "amqp://u:secret1@n1:5672/shop%2Fa,amqp://u:secret2@n2:5672/shop%2Fa",
        "http://n3:15672,http://n4:15672",
    )
    assert api.vhost == "shop/a"
    assert api.bases == ["http://n3:15672", "http://n4:15672"] and api.base == api.bases[0]
    assert api.configured


# What RabbitMQ 4.0.5's local cluster reports (measured: AMQP server properties and
# /api/overview give cluster_name "<node's name>@<the machine's FQDN>", each node its own;
# /api/nodes and overview's node give "<name>@localhost").
C4 = ["rmqd-c4-1@localhost", "rmqd-c4-2@localhost", "rmqd-c4-3@localhost"]


@pytest.mark.parametrize(
    ("amqp_name", "api_name", "api_node", "nodes", "same"),
    [
        ("rmqd-c4-2@vm", "rmqd-c4-1@vm", "rmqd-c4-1@localhost", C4, True),
        ("rmqd-c4-3@vm", "rmqd-c4-3@vm", None, [], True),  # one node, or a name set
        ("prod", "prod", None, [], True),
        # another broker on the same machine: the 3.10.8 node, against the cluster's API
        ("rabbit@vm", "rmqd-c4-1@vm", "rmqd-c4-1@localhost", C4, False),
        ("rmqd-c4-2@vm", "prod", "rabbit@n1", ["rabbit@n1", "rabbit@n2"], False),
        # nodes on machines of their own: the node's host is the FQDN's first label
        (
            "rabbit@n2.example.com",
            "rabbit@n1.example.com",
            "rabbit@n1",
            ["rabbit@n1", "rabbit@n2"],
            True,
        ),
        (
            "rabbit@n9.example.com",
            "rabbit@n1.example.com",
            "rabbit@n1",
            ["rabbit@n1", "rabbit@n2"],
            False,
        ),
        # a user without the monitoring tag sees no nodes: it cannot tell
        ("rmqd-c4-2@vm", "rmqd-c4-1@vm", None, [], None),
    ],
)
def test_same_cluster(
    amqp_name: str, api_name: str, api_node: str | None, nodes: list[str], same: bool | None
) -> None:
    assert same_cluster(amqp_name, api_name, api_node, nodes) is same


@pytest.mark.parametrize(
    ("failures", "code", "answered"), [(2, 500, True), (3, 500, False), (1, 404, False)]
)
def test_a_get_answered_with_a_server_error_is_tried_again_twice(
    failures: int, code: int, answered: bool
) -> None:
    """RabbitMQ 3.10's API answers 500 to a listing that races a queue's deletion: a GET
    (which changes nothing) is tried again twice; a 4xx is the answer at once."""
    import urllib.error

    from tests.helpers.support import json_api

    calls: list[str] = []

    def flaky(path: str) -> tuple[int, object]:
        calls.append(path)
        return (200, [{"name": "q"}]) if len(calls) > failures else (code, {"error": "boom"})

    with json_api(flaky) as base:
        api = ManagementApi("amqp://u:p@127.0.0.1/%2F", base)
        if answered:
            assert api.get("queues/%2F?columns=name") == [{"name": "q"}]
        else:
            with pytest.raises(urllib.error.HTTPError) as raised:
                api.get("queues/%2F?columns=name")
            assert raised.value.code == code
    assert len(calls) == (1 if code < 500 else min(failures + 1, 3))
    assert set(calls) == {"/api/queues/%2F?columns=name"}
