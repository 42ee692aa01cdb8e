"""The test infrastructure without a broker: scripts/broker.py's sources, URL masking,
prefixes.  Its broker-side half is tests/broker/test_infra_smoke.py."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pytest
from broker import BrokerInfo, mask_url
from brokers import base, chroot, cluster, container, debian, find

from tests.helpers.broker_fakes import FakeContainer
from tests.helpers.brokerctl import make_prefix


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("amqps://u:p%40ss@h:5671/v?heartbeat=5", "amqps://u:***@h:5671/v?heartbeat=5"),
        ("amqp://u:p@ss@h/%2F", "amqp://u:***@h/%2F"),
        ("amqp://host:5672/%2F", "amqp://host:5672/%2F"),
        ("amqp://user@host/", "amqp://user@host/"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_broker_info_repr_hides_password() -> None:
    info = BrokerInfo("amqp://u:s3cret@h:5672/%2F", None, "env")
    assert "s3cret" not in repr(info) and "s3cret" not in str(info)


def test_prefix_shape(prefix: str) -> None:
    assert re.fullmatch(r"t-[a-z0-9-]+-[0-9a-f]{6}", prefix)
    assert "prefix-shape" in prefix
    long = make_prefix("test_" + "Very_Long[Param-Ünïcode]" * 5)
    assert len(long) <= 40 and re.fullmatch(r"[a-z0-9-]+", long)
    assert make_prefix("test_x") != make_prefix("test_x")


# --------------------------------------------------------------------------- broker.py sources


def test_no_source_explains_what_to_do(
    no_broker_here: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(no_broker_here.BrokerUnavailable) as info, no_broker_here.ensure_broker():
        pass
    text = str(info.value)
    assert "RMQDELAY_URL" in text and "rabbitmq-server" in text and "Docker" in text
    assert no_broker_here.plan().source is None
    assert no_broker_here.main(["--check"]) == 1
    assert no_broker_here.main([]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "RMQDELAY_URL" in out.err


def test_failed_container_falls_through(
    no_broker_here: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(container, "docker_available", lambda: (True, "fake engine"))
    monkeypatch.setattr(
        container, "container_class", lambda: lambda image: FakeContainer(image, fail=True)
    )
    with (
        pytest.raises(no_broker_here.BrokerUnavailable, match="pull access denied"),
        no_broker_here.ensure_broker(),
    ):
        pass


def test_debian_start_that_never_answers(
    no_broker_here: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    server = tmp_path / "rabbitmq-server"
    server.write_text(f'#!/bin/sh\n[ "$1" = -detached ] && echo "$1" > {marker}\n')
    server.chmod(0o755)
    monkeypatch.setattr(debian, "DEBIAN_SERVER", str(server))
    monkeypatch.setattr(debian, "START_TIMEOUT", 1.0)
    assert no_broker_here.plan().source == "debian"
    with (
        pytest.raises(no_broker_here.BrokerUnavailable, match="did not answer within 1s"),
        no_broker_here.ensure_broker(),
    ):
        pass
    assert marker.read_text().strip() == "-detached"


def test_enabling_management_on_a_broker_not_ours_says_so_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No broker's plugins change here: rabbitmq-plugins is replaced; the notice is real."""
    enabled: list[tuple[str, ...]] = []

    def enable_plugins(node: debian.DebianNode, *plugins: str) -> tuple[bool, str]:
        enabled.append(plugins)
        return True, "enabled"

    monkeypatch.setattr(base, "_quiet", True)  # the notice prints even with --quiet
    monkeypatch.delenv("RMQDELAY_MANAGEMENT_URL", raising=False)  # else it names the API
    monkeypatch.setattr(find, "management_ok", lambda *args, **kwargs: bool(enabled))
    monkeypatch.setattr(debian, "is_root", lambda: True)
    monkeypatch.setattr(debian, "plugin_listed", lambda node, plugin: False)
    monkeypatch.setattr(debian, "enable_plugins", enable_plugins)
    monkeypatch.setattr(debian, "has_tool", lambda node, tool: True)
    info = find._with_management(BrokerInfo(find.local_url(), None, "local"))
    err = capsys.readouterr().err
    assert "NOTE: enabling the rabbitmq_management plugin on the broker at 127.0.0.1:5672" in err
    assert "not started by scripts/broker.py" in err and "--no-management" in err
    assert enabled == [("rabbitmq_management",)]
    assert info.management_url == "http://127.0.0.1:15672"


def test_a_second_local_broker_never_gets_the_first_ones_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """RabbitMQ 4 on :5682 beside 3.10 on :5672: :15672 answers, but is the other broker's."""
    asked: list[tuple[str, int | None]] = []

    def management_ok(url: str, amqp_url: str, timeout: float = 3.0, **kw: int | None) -> bool:
        asked.append((url, kw.get("amqp_port")))
        return url == "http://127.0.0.1:15682" and kw.get("amqp_port") == 5682

    monkeypatch.delenv("RMQDELAY_MANAGEMENT_URL", raising=False)
    monkeypatch.setattr(find, "management_ok", management_ok)
    info = find._with_management(BrokerInfo("amqp://guest:guest@127.0.0.1:5682/%2F", None, "env"))
    assert info.management_url == "http://127.0.0.1:15682"
    assert asked == [("http://127.0.0.1:15682", 5682)]


def test_management_ok_checks_the_api_serves_the_amqp_port() -> None:
    """An answering API whose listeners name another AMQP port is not this broker's."""
    from brokers.probe import management_ok

    from tests.helpers.support import json_api

    overview = {"rabbitmq_version": "3.10.8", "listeners": [{"protocol": "amqp", "port": 5672}]}
    with json_api(lambda _path: (200, overview)) as api:
        url = "amqp://guest:guest@127.0.0.1:5682/%2F"
        assert management_ok(api, url)
        assert management_ok(api, url, amqp_port=5672)
        assert not management_ok(api, url, amqp_port=5682)


# --------------------------------------------------------------------------- chroot releases


def test_each_chroot_release_has_its_own_ports_node_and_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """4.0 keeps what it had; 4.3 sits beside it, one port further, in a sid chroot."""
    rmq4, rmq43 = chroot.RELEASES["rmq4"], chroot.RELEASES["rmq43"]
    assert (rmq4.version, rmq4.suite, rmq43.version, rmq43.suite) == ("4.0", "trixie", "4.3", "sid")
    assert (rmq4.amqp_port, rmq4.management_port, rmq4.dist_port) == (5682, 15682, 25682)
    assert (rmq43.amqp_port, rmq43.management_port, rmq43.dist_port) == (5683, 15683, 25683)
    assert rmq43.node_name == "rmqd-rmq43@localhost" and rmq4.node_name == "rmqd-rmq4@localhost"
    assert rmq43.url == "amqp://guest:guest@127.0.0.1:5683/%2F"
    assert rmq43.management_url == "http://127.0.0.1:15683"
    config = rmq43.config()
    assert "listeners.tcp.1 = 127.0.0.1:5683" in config["etc/rabbitmq/rabbitmq.conf"]
    assert "management.tcp.port = 15683" in config["etc/rabbitmq/rabbitmq.conf"]
    assert config["etc/rabbitmq/rabbitmq-env.conf"] == (
        "NODENAME=rmqd-rmq43@localhost\nDIST_PORT=25683\n"
    )
    # only sid's mirror snapshot needs its expired Release file accepted
    assert rmq43.apt_update_options == ("-o", "Acquire::Check-Valid-Until=false")
    assert rmq4.apt_update_options == ()

    monkeypatch.delenv("RMQDELAY_RMQ43_ROOT", raising=False)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert rmq43.root == Path("/var/cache/rmqdelay/rabbitmq43-sid")
    assert rmq4.root.name == "rabbitmq4-trixie"
    monkeypatch.setenv("RMQDELAY_RMQ43_ROOT", str(tmp_path))
    assert rmq43.root == tmp_path and rmq4.root != tmp_path
    node = rmq43.node()  # the chroot's default node: its name comes from /etc/rabbitmq
    assert node.command("rabbitmq-server", "-detached") == [
        "chroot",
        str(tmp_path),
        "/usr/sbin/rabbitmq-server",
        "-detached",
    ]
    assert node.environment() == {}  # no RABBITMQ_NODENAME: stop() tells it from a cluster's
    with pytest.raises(base.BrokerUnavailable, match="say one of rmq4, rmq43"):
        chroot.release("rmq5")


def test_a_fresh_machine_builds_the_sid_chroot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """debootstrap installed when missing, sid bootstrapped, apt told to accept sid's
    expired Release file, rabbitmq-server installed; the chroot appears only when whole."""
    root = tmp_path / "rabbitmq43-sid"
    monkeypatch.setenv("RMQDELAY_RMQ43_ROOT", str(root))
    ran: list[list[str]] = []

    def run(cmd: list[str], timeout: float) -> None:
        ran.append(cmd)
        if cmd[0] == "debootstrap":
            (Path(cmd[-1]) / "usr/sbin").mkdir(parents=True)
        if cmd[-1] == "rabbitmq-server":
            server = Path(cmd[1]) / "usr/lib/rabbitmq/bin/rabbitmq-server"
            server.parent.mkdir(parents=True)
            server.write_text("")

    monkeypatch.setattr(chroot, "_run", run)
    monkeypatch.setattr(shutil, "which", lambda tool: None)
    rel = chroot.RELEASES["rmq43"]
    chroot.ensure_chroot(rel)
    building = str(tmp_path / "rabbitmq43-sid.building")
    assert ran == [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "debootstrap"],
        ["debootstrap", "--variant=minbase", "sid", building],
        ["chroot", building, "apt-get", "-o", "Acquire::Check-Valid-Until=false", "update", "-qq"],
        [
            "chroot",
            building,
            *("apt-get", "install", "-y", "-qq", "--no-install-recommends", "rabbitmq-server"),
        ],
    ]
    assert (root / "usr/sbin/policy-rc.d").read_text().endswith("exit 101\n")
    ran.clear()
    assert chroot.ensure_chroot(rel) == 0.0 and ran == []  # reused when present


def test_the_chroot_gets_the_hosts_etc_hosts(tmp_path: Path) -> None:
    """Without localhost in it, a node named @localhost hangs at boot, silently."""
    (tmp_path / "etc").mkdir()
    chroot._copy_hosts(tmp_path)
    assert (tmp_path / "etc/hosts").read_bytes() == Path("/etc/hosts").read_bytes()
    (tmp_path / "etc/hosts").write_text("# stale\n")
    chroot._copy_hosts(tmp_path)
    assert (tmp_path / "etc/hosts").read_bytes() == Path("/etc/hosts").read_bytes()


def test_the_cluster_runs_4_3_by_default_on_ports_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(cluster.VERSION_ENV, raising=False)
    monkeypatch.setattr(cluster, "_selected", [])
    assert cluster.current().version == "4.3"
    assert cluster.urls()[0] == "amqp://guest:guest@127.0.0.1:5721/%2F"
    assert cluster.management_urls() == [f"http://127.0.0.1:{p}" for p in (15721, 15722, 15723)]
    assert cluster.node_names()[2] == "rmqd-c43-3@localhost"
    assert cluster.current().release is chroot.RELEASES["rmq43"]
    firsts = {version: cluster.select(version).first_port for version in ("4.0", "4", "3.10", "3")}
    assert firsts == {"4.0": 5711, "4": 5711, "3.10": 5701, "3": 5701}
    assert cluster.current().root is None  # 3.10 is the host's
    with pytest.raises(base.BrokerUnavailable, match=r"say 43 \(4\.3, sid chroot\)"):
        cluster.select("4.1")


def test_the_listener_of_a_port_and_its_open_files_limit_are_read_from_proc() -> None:
    """A real listening socket of this process: /proc names its pid and its limit."""
    import resource
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        from brokers.probe import listener_pid, open_files_limit

        assert listener_pid(port) == os.getpid()
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert open_files_limit(os.getpid()) == (None if soft < 0 else soft)
    assert listener_pid(port) is None


@dataclass
class _LocalNode:
    """This machine's node on :5672 as ``find`` sees it, with ``restart_node`` replaced:
    no node is restarted here."""

    limits: list[int]
    """What ``open_files_limit`` answers, in turn; the last one stays."""
    fails: str = ""
    """When set, ``restart_node`` raises BrokerUnavailable with it."""
    restarted: list[debian.DebianNode] = field(default_factory=list)


@pytest.fixture
def local_node(monkeypatch: pytest.MonkeyPatch) -> _LocalNode:
    node = _LocalNode(limits=[1024])

    def open_files_limit(pid: int) -> int:
        return node.limits.pop(0) if len(node.limits) > 1 else node.limits[0]

    def restart_node(target: debian.DebianNode) -> float:
        if node.fails:
            raise base.BrokerUnavailable(node.fails)
        node.restarted.append(target)
        return 0.5

    monkeypatch.setattr(find, "listener_pid", lambda port: 4242)
    monkeypatch.setattr(find, "open_files_limit", open_files_limit)
    monkeypatch.setattr(find, "_is_beam", lambda pid: True)
    monkeypatch.setattr(debian, "is_root", lambda: True)
    monkeypatch.setattr(debian, "DEBIAN_SERVER", shutil.which("sh"))
    monkeypatch.setattr(debian, "restart_node", restart_node)
    return node


@pytest.mark.parametrize(("limit", "restarts"), [(1024, 1), (debian.ENOUGH_OPEN_FILES, 0)])
def test_a_local_node_with_too_few_open_files_is_restarted_with_more(
    local_node: _LocalNode, capsys: pytest.CaptureFixture[str], limit: int, restarts: int
) -> None:
    """Debian starts its node with 1024 open files, and a suite's quorum queues then leave
    connections hanging in the handshake: this machine's node is restarted, saying so
    first."""
    # read again under the lock (another worker may have restarted it): still the same
    local_node.limits = [limit]
    errors: list[str] = []
    assert find._raise_local_limit(errors) and not errors
    assert len(local_node.restarted) == restarts
    if restarts:
        restarted = local_node.restarted[0]
        assert restarted.port == find.LOCAL_PORT and restarted.node_name is None
        assert f"allows {limit} open files" in capsys.readouterr().err


def test_a_node_that_cannot_be_restarted_with_more_open_files_gives_way(
    local_node: _LocalNode,
) -> None:
    """When the restart fails, the local node is not used: a node of our own serves."""
    local_node.fails = "rabbitmqctl stop did not stop it"
    errors: list[str] = []
    assert not find._raise_local_limit(errors)
    assert "allows 1024 open files" in errors[0] and "did not stop it" in errors[0]


def test_a_node_another_process_restarted_meanwhile_is_not_restarted_again(
    local_node: _LocalNode,
) -> None:
    """pytest-xdist workers each find the low limit; the one that waited on the lock reads
    it again and finds the node restarted by another."""
    local_node.limits = [1024, 20000]
    assert find._raise_local_limit([]) and local_node.restarted == []


def test_the_system_node_starts_with_the_packages_environment_and_more_open_files() -> None:
    node = debian.system_node()
    assert node.env_file == debian.SYSTEM_ENV_FILE
    text = debian.SYSTEM_ENV_FILE.read_text()
    assert f". {debian.PACKAGE_ENV_FILE}" in text and f"ulimit -n {debian.OPEN_FILES}" in text
    assert node.environment()["RABBITMQ_CONF_ENV_FILE"] == str(debian.SYSTEM_ENV_FILE)


def test_a_whole_node_test_waits_for_the_tests_under_way_and_new_ones_wait_for_it(
    prefix: str,
) -> None:
    """node_share is a readers-writer lock across processes (flock: each open file is its
    own holder, so threads stand in for the suites' processes here)."""
    import threading

    from tests.helpers.consumer_timeouts import node_share

    url = f"amqp://guest:guest@{prefix}.invalid:1/%2F"  # a lock file of this test's own
    order: list[str] = []
    sharing, whole_waits, release_first = threading.Event(), threading.Event(), threading.Event()
    got_whole, release_whole, late_started = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with node_share(url, whole=False):
            order.append("shared")
            sharing.set()
            release_first.wait(10)
            order.append("shared done")

    def whole() -> None:
        sharing.wait(10)
        whole_waits.set()
        with node_share(url, whole=True):
            order.append("whole")
            got_whole.set()
            release_whole.wait(10)
            order.append("whole done")

    def late() -> None:
        late_started.set()
        with node_share(url, whole=False):
            order.append("late")

    threads = [threading.Thread(target=first), threading.Thread(target=whole)]
    for thread in threads:
        thread.start()
    whole_waits.wait(10)
    assert not got_whole.wait(0.5), "the whole-node test did not wait for the shared one"
    threads.append(threading.Thread(target=late))
    threads[-1].start()
    late_started.wait(10)
    release_first.set()
    assert got_whole.wait(10)
    release_whole.set()
    for thread in threads:
        thread.join(10)
    assert order == ["shared", "shared done", "whole", "whole done", "late"]
    for leftover in Path(tempfile.gettempdir()).glob(f"rmqdelay-tests-{prefix}.invalid-1.*"):
        leftover.unlink()
