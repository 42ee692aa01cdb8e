#!/usr/bin/env python3
"""Find or start a RabbitMQ broker for rmqdelay's tests, demo and benchmarks.

The work is done by the ``brokers`` package beside this file (see its docstring for
where a broker comes from); this is its command line::

    python scripts/broker.py            # ensure a broker; print its URL on stdout
                                        # (nothing on stdout for testcontainers)
    python scripts/broker.py --check    # say which source would be used; start nothing
    python scripts/broker.py --run -- CMD ARGS...
                                        # run CMD with RMQDELAY_URL set (any source,
                                        # the container lives as long as CMD)
    --no-management                     # never enable the management plugin
    python scripts/broker.py cluster start|stop
                                        # 3 local nodes of RabbitMQ 4.3 (sid chroot) on
                                        # :5721-5723 (make cluster); start prints their
                                        # masked URLs
    python scripts/broker.py cluster urls|management-urls
                                        # comma-separated, for $(...) (make cluster-test)
    python scripts/broker.py cluster partition N|heal N
                                        # cut node N (1-3) off from the others with
                                        # nftables (clients still reach it); heal it
    python scripts/broker.py cluster --rabbitmq 4 start|stop|urls|management-urls
                                        # the same of RabbitMQ 4.0 (trixie chroot) on
                                        # :5711-5713; --rabbitmq 3: the host's 3.10 on
                                        # :5701-5703 (default: $RMQDELAY_CLUSTER_RABBITMQ,
                                        # else 43)
    python scripts/broker.py rmq43 start|stop|running
                                        # RabbitMQ 4.3 in a sid chroot on :5683
                                        # (management :15683); start prints its URL,
                                        # running exits 0 when it answers
    python scripts/broker.py rmq4 start|stop
                                        # RabbitMQ 4.0 in a trixie chroot on :5682
                                        # (management :15682)

The tests import ``BrokerInfo``, ``BrokerUnavailable``, ``SecretUrl``, ``ensure_broker``
and ``mask_url`` from here.  Passwords are never printed: diagnostics show masked URLs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

# the brokers package lives beside this file (sys.path[0] when run as a script)
from brokers import BrokerInfo, BrokerUnavailable, SecretUrl, chroot, container, find, mask_url
from brokers.base import error, log, set_quiet
from brokers.find import ENV_VAR, ensure_broker, plan
from brokers.probe import tcp_open

__all__ = ["BrokerInfo", "BrokerUnavailable", "SecretUrl", "ensure_broker", "main", "mask_url"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="broker.py",
        description="Find or start a RabbitMQ broker (env, local, testcontainers, debian). "
        "Prints its URL on stdout; diagnostics (masked URLs) go to stderr.",
    )
    parser.add_argument(
        "--check", action="store_true", help="say which source would be used; start nothing"
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help="--run -- CMD ARGS...: run CMD with RMQDELAY_URL set to the broker "
        "(a container lives as long as CMD)",
    )
    parser.add_argument(
        "--no-management",
        dest="management",
        action="store_false",
        help="do not look for the management API, nor enable its plugin on a local broker",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only errors on stderr")
    parser.add_argument(
        "--print-management",
        action="store_true",
        help="print the management API's URL on a second line (empty if none), for a broker "
        "whose API is not at :15672 (make exports it as RMQDELAY_MANAGEMENT_URL)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in chroot.RELEASES:
        return _chroot_node(chroot.RELEASES[argv[0]], argv[1:])
    if argv[:1] == ["cluster"]:
        return _cluster(argv[1:])
    command: list[str] = []
    if "--" in argv:  # everything after "--" is the command for --run
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)
    set_quiet(args.quiet)
    if args.check and args.run:
        parser.error("--check and --run are exclusive")
    if command and not args.run:
        parser.error("a command after -- needs --run")

    if args.check:
        p = plan()
        if p.source is None:
            error(p.detail)
            return 1
        print(f"{p.source}: {p.detail}")
        return 0

    try:
        if args.run:
            if not command:
                parser.error("--run needs a command after --")
            with ensure_broker(management=args.management) as info:
                log(f"source={info.source} url={info.masked_url}; running {' '.join(command)}")
                return subprocess.call(command, env=dict(os.environ, **{ENV_VAR: info.url}))

        # A container would die with this process: on a Docker-only machine say so and
        # succeed; pytest's broker fixture (or --run) starts the container.
        if not os.environ.get(ENV_VAR, "").strip() and not tcp_open(
            find.LOCAL_HOST, find.LOCAL_PORT
        ):
            docker_ok, docker_detail = container.docker_available()
            if docker_ok and container.testcontainers_importable():
                log(f"source=testcontainers ({docker_detail}): pytest's broker fixture starts it")
                return 0
        with ensure_broker(allow_testcontainers=False, management=args.management) as info:
            log(f"source={info.source} url={info.masked_url} management={info.management_url}")
            print(info.url, flush=True)  # unmasked, for $(...) in shells
            if args.print_management:
                print(info.management_url or "", flush=True)
        return 0
    except BrokerUnavailable as exc:
        error(str(exc))
        return 1


def _cluster(argv: list[str]) -> int:
    """``cluster start`` (idempotent) prints the nodes' masked URLs; ``cluster stop``;
    ``cluster urls`` and ``cluster management-urls`` print comma-separated lists for
    ``$(...)`` in a shell (the AMQP ones unmasked: never to a terminal).
    ``--rabbitmq 43|4|3`` (or ``--rabbitmq=3``) picks the RabbitMQ the cluster runs."""
    from brokers import cluster

    usage = (
        "usage: broker.py cluster [--rabbitmq 43|4|3] "
        "start|stop|urls|management-urls|partition N|heal N"
    )
    argv = list(argv)
    version: str | None = None
    for i, arg in enumerate(argv):
        if arg.startswith("--rabbitmq="):
            version = arg.split("=", 1)[1]
            del argv[i]
            break
        if arg == "--rabbitmq":
            if i + 1 >= len(argv):
                error(usage)
                return 2
            version = argv[i + 1]
            del argv[i : i + 2]
            break
    try:
        if version is not None:
            cluster.select(version)
        if argv == ["start"]:
            started = time.monotonic()
            cluster.start()
            rows = zip(cluster.node_names(), cluster.urls(), cluster.management_urls(), strict=True)
            for name, url, api in rows:
                print(f"{name}  {mask_url(url)}  management {api}", flush=True)
            log(f"cluster start took {time.monotonic() - started:.0f}s")
            return 0
        if argv == ["stop"]:
            return 0 if cluster.stop() else 1
        if argv == ["urls"]:
            print(",".join(cluster.urls()), flush=True)
            return 0
        if argv == ["management-urls"]:
            print(",".join(cluster.management_urls()), flush=True)
            return 0
        if len(argv) == 2 and argv[0] == "partition" and argv[1] in ("1", "2", "3"):
            cluster.partition(int(argv[1]) - 1)
            return 0
        if len(argv) == 2 and argv[0] == "heal" and argv[1] in ("1", "2", "3"):
            cluster.heal(int(argv[1]) - 1)
            return 0
    except BrokerUnavailable as exc:
        error(str(exc))
        return 1
    error(usage)
    return 2


def _chroot_node(rel: chroot.Release, argv: list[str]) -> int:
    """``rmq43 start`` prints the URL (and the management URL on stderr); ``rmq43 stop``;
    ``rmq43 running`` exits 0 when the node answers AMQP, else 1 (it starts nothing).
    The same for every release of brokers.chroot.RELEASES (``rmq4``: 4.0)."""
    try:
        if argv == ["start"]:
            url = chroot.start(rel)
            log(f"RabbitMQ {rel.version}: {mask_url(url)}, management {rel.management_url}")
            print(url, flush=True)
            return 0
        if argv == ["stop"]:
            return 0 if chroot.stop(rel) else 1
        if argv == ["running"]:
            return 0 if chroot.running(rel) else 1
    except BrokerUnavailable as exc:
        error(str(exc))
        return 1
    error(f"usage: broker.py {rel.name} start|stop|running")
    return 2


if __name__ == "__main__":
    sys.exit(main())
