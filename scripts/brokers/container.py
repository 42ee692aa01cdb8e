"""A throw-away RabbitMQ in Docker, through testcontainers.

The container lives only as long as the ``with`` block (the process) that started it,
so the command line never starts one for later: pytest's fixture or ``--run`` does.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.parse
from collections.abc import Iterator
from typing import Any

from .base import BrokerInfo, log
from .probe import management_ok, wait_for

__all__ = [
    "CONTAINER_IMAGE",
    "container_class",
    "docker_available",
    "run_container",
    "testcontainers_importable",
]

CONTAINER_IMAGE = "rabbitmq:4.3-management"
"""The newest RabbitMQ rmqdelay supports (make test-rmq43 runs the suite on 4.3.6)."""
MANAGEMENT_PORT = 15672


def docker_available(timeout: float = 15.0) -> tuple[bool, str]:
    """Does a Docker engine answer (``docker info`` or the docker SDK's ping)?"""
    why = "no docker CLI"
    if shutil.which("docker"):
        try:
            proc = subprocess.run(
                ["docker", "info", "--format", "{{.ServerVersion}}"],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            if proc.returncode == 0 and proc.stdout.strip():
                return True, f"Docker engine {proc.stdout.strip()}"
            why = "docker info failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"docker info failed: {exc}"
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]

        client = docker.from_env(timeout=int(timeout))  # type: ignore[attr-defined,unused-ignore]
        try:
            if client.ping():
                return True, "Docker engine (SDK ping)"
        finally:
            client.close()
    except ImportError:
        pass
    except Exception as exc:  # DockerException and friends
        why += f"; SDK: {type(exc).__name__}"
    return False, why


def container_class() -> Any:
    """testcontainers' RabbitMqContainer (its module moved between releases)."""
    try:
        from testcontainers.community.rabbitmq import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            RabbitMqContainer,
        )
    except ImportError:
        from testcontainers.rabbitmq import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            RabbitMqContainer,
        )
    return RabbitMqContainer


def testcontainers_importable() -> bool:
    try:
        container_class()
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def run_container(errors: list[str], management_timeout: float) -> Iterator[BrokerInfo | None]:
    """Yield a BrokerInfo for a fresh container, or None (reason appended to *errors*)."""
    try:
        cls = container_class()
    except ImportError:
        errors.append("testcontainers is not installed (pip install 'testcontainers[rabbitmq]')")
        yield None
        return
    log(f"starting {CONTAINER_IMAGE} with testcontainers (first pull can take a while)")
    container = (
        cls(CONTAINER_IMAGE)
        .with_exposed_ports(MANAGEMENT_PORT)
        # stats every second (default 5 s): the management API then lists new and
        # closed connections sooner, which tests that close connections wait for
        .with_env("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", "-rabbit collect_statistics_interval 1000")
    )
    try:
        container.start()
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(container.port))
        mport = int(container.get_exposed_port(MANAGEMENT_PORT))
    except Exception as exc:
        errors.append(f"testcontainers failed: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            container.stop()
        yield None
        return
    try:
        user = urllib.parse.quote(container.username, safe="")
        pw = urllib.parse.quote(container.password, safe="")
        url = f"amqp://{user}:{pw}@{host}:{port}/%2F"
        candidate = f"http://{host}:{mport}"
        answered = wait_for(lambda: management_ok(candidate, url), management_timeout)
        if not answered:
            log("the container's management API did not answer: tests cannot administer it")
        log(f"container ready on {host}:{port}")
        yield BrokerInfo(
            url=url, management_url=candidate if answered else None, source="testcontainers"
        )
    finally:
        log("stopping the RabbitMQ container")
        with contextlib.suppress(Exception):
            container.stop()
