"""The words and kinds of publish failures, from the pure core."""

from __future__ import annotations

from rmqdelay import PublisherClosedError, Settings, UnroutableError
from rmqdelay.core import failures
from rmqdelay.core.publishing.publisher import PublisherCore


def test_a_missing_exchange_is_this_messages_only_when_the_broker_names_it() -> None:
    """A 404 close names one exchange: this message's tier means it was not sent (run
    `topology apply`); another message's leaves this one's fate unknown (send again)."""
    core = PublisherCore(Settings(max_delay="1h").layout)
    out = core.finalize(core.prepare("orders", b"x", delay="30s"))
    mine = f"NOT_FOUND - no exchange '{out.exchange}' in vhost '/'"
    other = "NOT_FOUND - no exchange 'someone-else' in vhost '/'"

    missing = failures.no_exchange(out, mine)
    assert isinstance(missing, UnroutableError)
    assert "rmqdelay topology apply" in str(missing) and out.message_id in str(missing)

    unknown = failures.no_exchange(out, other)
    assert isinstance(unknown, PublisherClosedError)
    assert "publish it again" in str(unknown) and "someone-else" in str(unknown)
