"""Stand-ins for what scripts/broker.py looks for, shared by the unit and broker tests."""

from __future__ import annotations


class FakeContainer:
    """Stands in for RabbitMqContainer, pointing at a local guest/guest broker on 5672
    (``fail=True``: its start fails as a refused image pull would)."""

    stopped: list[bool] = []  # noqa: RUF012

    def __init__(self, image: str, fail: bool = False) -> None:
        self.image, self.fail = image, fail
        self.port, self.username, self.password = 5672, "guest", "guest"
        self.env: dict[str, str] = {}

    def with_exposed_ports(self, *ports: int) -> FakeContainer:
        return self

    def with_env(self, key: str, value: str) -> FakeContainer:
        self.env[key] = value
        return self

    def start(self) -> FakeContainer:
        if self.fail:
            raise RuntimeError("pull access denied")
        return self

    def get_container_host_ip(self) -> str:
        return "127.0.0.1"

    def get_exposed_port(self, port: int) -> int:
        return port

    def stop(self) -> None:
        self.stopped.append(True)
