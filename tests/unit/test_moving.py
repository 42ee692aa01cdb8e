"""What ``rmqdelay move`` does with each message it takes (rmqdelay.core.journal.moving):
by the old cluster's journal (cancels, keys, reschedules) and the new one's copies."""

from __future__ import annotations

from datetime import timezone
from typing import Literal

from rmqdelay.core.journal.moving import MoveReport, decide, request_of
from rmqdelay.core.journal.records import JournalRecord
from rmqdelay.core.journal.state import JournalState
from rmqdelay.core.messages import ATTEMPT, DESTINATION, DUE_AT, KEY

NOW = 1_800_000_000_000


def scheduled(message_id: str, due: int, key: str | None = None) -> JournalRecord:
    conflict: Literal["ignore"] | None = "ignore" if key is not None else None
    return JournalRecord(
        "scheduled",
        message_id,
        "orders",
        due,
        recorded_at_ms=NOW - 1000,
        key=key,
        on_conflict=conflict,
    )


def headers(due: int, key: str | None = None, attempt: int = 1) -> dict[str, object]:
    found: dict[str, object] = {DESTINATION: "orders", DUE_AT: due, ATTEMPT: attempt, "t": "a"}
    if key is not None:
        found[KEY] = key
    return found


def test_each_message_moves_stays_or_is_found_there() -> None:
    state = JournalState()
    state.add(scheduled("plain", NOW + 5000))
    state.add(scheduled("gone", NOW + 5000))
    state.add(JournalRecord("cancelled", "gone", "orders", NOW + 5000, recorded_at_ms=NOW))
    state.add(scheduled("first", NOW + 5000, key="k"))
    state.add(scheduled("second", NOW + 6000, key="k"))  # loses
    state.add(scheduled("later", NOW + 5000))
    moved = (NOW + 5000,)  # a reschedule names the copies it moves
    state.add(
        JournalRecord(
            "rescheduled", "later", "orders", NOW + 60_000, recorded_at_ms=NOW, cancels_due_ms=moved
        )
    )
    view = state.view
    there = {"moved-before": {NOW + 5000}, "due-before": {NOW + 30}}

    def what(message_id: str, due: int, key: str | None = None) -> tuple[str, int, str]:
        moving = decide(view, there, headers(due, key), message_id, NOW)
        return moving.action, moving.due_ms, moving.reason

    assert what("plain", NOW + 5000) == ("move", NOW + 5000, "")
    assert what("gone", NOW + 5000) == ("skip", NOW + 5000, "cancelled")
    assert what("first", NOW + 5000, "k") == ("move", NOW + 5000, "")
    assert what("second", NOW + 6000, "k") == ("skip", NOW + 6000, "ignored")
    assert what("later", NOW + 5000) == ("move", NOW + 60_000, "")  # at its new time
    assert what("moved-before", NOW + 5000) == ("moved", NOW + 5000, "")
    # due when a cut-off run moved it: sent at once, its copy there is due at that moment
    assert what("due-before", NOW - 10) == ("moved", NOW - 10, "")
    assert what("due-before", NOW + 9000)[0] == "move"  # another copy, still ahead
    assert what("recurring:r@1", NOW + 5000, "recurring:r@1")[0] == "recurring"
    nowhere = decide(view, there, {DUE_AT: NOW}, "x", NOW)
    assert (nowhere.action, nowhere.reason) == ("skip", "no rmqdelay-destination")


def test_the_request_keeps_id_due_time_attempt_key_headers_and_properties() -> None:
    moving = decide(JournalState().view, {}, headers(NOW + 5000, "k", 3), "m1", NOW)
    request = request_of(moving, b"body", headers(NOW + 5000, "k", 3), {"content_type": "x/y"})
    assert request["at"].tzinfo is timezone.utc
    assert round(request["at"].timestamp() * 1000) == NOW + 5000
    assert request["headers"] == {ATTEMPT: 3, "t": "a"}  # rmqdelay's own are made again
    assert (request["key"], request["on_conflict"]) == ("k", "ignore")  # sent twice: once
    assert (request["message_id"], request["body"], request["content_type"]) == (
        "m1",
        b"body",
        "x/y",
    )
    report = MoveReport()
    report.count(moving)
    assert report.to_json()["by_destination"] == {"orders": 1}
    assert report.describe() == "moved 1 message(s)"
