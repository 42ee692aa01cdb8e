"""The journal's and its checkpoints' retention: by size, the policy that moves a journal
of an earlier release to it, and the documents' copies of that policy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rmqdelay import ConfigurationError, Settings
from rmqdelay.core.journal.checkpoint import checkpoint_name
from rmqdelay.core.journal.records import journal_name
from rmqdelay.core.layout import parse_size, segment_bytes
from rmqdelay.core.topology import (
    STREAM_RETENTION,
    build_topology,
    kept_difference,
    retention_policy,
)

ROOT = Path(__file__).resolve().parents[2]


def test_both_streams_keep_a_size_in_segments_of_an_eighth_and_no_age() -> None:
    layout = Settings(max_delay="10s", journal_retention="1GiB").layout
    topology = build_topology(layout, ["orders"])
    for name in (journal_name(layout), checkpoint_name(layout)):
        arguments = topology.queue(name).arguments
        assert arguments["x-queue-type"] == "stream"
        assert arguments["x-max-length-bytes"] == 1024**3
        assert arguments["x-stream-max-segment-size-bytes"] == 1024**3 // 8
        assert "x-max-age" not in arguments


def test_sizes_read_as_written_and_a_useless_one_is_refused() -> None:
    assert parse_size("2GiB") == 2 * 1024**3
    assert parse_size("500MB") == 500_000_000
    assert parse_size(64 * 1024**2) == 64 * 1024**2
    with pytest.raises(ConfigurationError, match="under the least useful, 64 MiB"):
        parse_size("10MB")
    with pytest.raises(ConfigurationError, match="a size in bytes"):
        parse_size("two gigs")
    assert segment_bytes(64 * 1024**2) == 16 * 1024**2  # RabbitMQ's smallest sensible
    assert segment_bytes(100 * 1024**3) == 500_000_000  # and its default, the largest


def test_a_stream_declared_with_another_retention_is_kept_and_nothing_else() -> None:
    layout = Settings(max_delay="10s").layout
    topology = build_topology(layout, ["orders"])
    for name in (journal_name(layout), checkpoint_name(layout)):
        for argument in STREAM_RETENTION:
            assert kept_difference(topology.queue(name), argument, missing=True) == "retention"
    work = topology.queue(layout.work_queue("orders"))
    assert kept_difference(work, "x-max-length-bytes", missing=True) is None


def test_the_policy_matches_the_two_streams_and_no_other_queue() -> None:
    layout = Settings(prefix="shop-eu", max_delay="10s").layout
    name, pattern, definition = retention_policy(layout)
    assert name == "shop-eu.schedule.retention"
    assert re.search(pattern, "shop-eu.schedule") and re.search(
        pattern, "shop-eu.schedule.checkpoints"
    )
    for other in (
        "shop-eu.schedule.x",
        "shop-euXschedule",
        "shop-eu.scheduled",
        "a.shop-eu.schedule",
    ):
        assert not re.search(pattern, other), other
    assert definition == {
        "max-length-bytes": layout.journal_retention,
        "stream-max-segment-size-bytes": segment_bytes(layout.journal_retention),
    }


@pytest.mark.parametrize("document", ["docs/operations/journal.md", "docs/protocol.md"])
def test_the_documents_show_the_policy_topology_apply_prints(document: str) -> None:
    """Their example, for the prefix ``shop`` at the default retention, is the policy."""
    text = " ".join((ROOT / document).read_text(encoding="utf-8").replace("\\\n", " ").split())
    found = re.search(r"set_policy (\S+) '([^']+)' '([^']+)' --apply-to queues", text)
    assert found is not None, f"{document} shows no set_policy line"
    name, pattern, definition = retention_policy(Settings(prefix="shop").layout)
    assert (found[1], found[2], json.loads(found[3])) == (name, pattern, definition)
