"""The schedule journal: what is recorded, what a reader makes of it, and how.

Every publish appends a record to a RabbitMQ stream, ``{prefix}.schedule``; a cancel, a
claim, a reschedule and a recurring schedule's change append theirs. Readers fold the
records. The modules, from the ground up (each imports only those before it):

- :mod:`.records`: a record and its codec (one JSON line; a write holds hundreds);
- :mod:`.generations`: what a key book holds (generations, losers, moves) and its
  checkpoint form;
- :mod:`.keys`: the key book, the fold of keys, claims and moves, and a worker's verdict;
- :mod:`.view`: the schedule a reader folds (every copy, what cancels or hides it);
- :mod:`.tombstones`: the cancelled copies a worker skips;
- :mod:`.rules` and :mod:`.recurring`: recurring schedules' rules and their book;
- :mod:`.steps`: what a journal flow asks of the adapter running it;
- :mod:`.flows`, :mod:`.key_flows`, :mod:`.view_follow`, :mod:`.reschedule`,
  :mod:`.recurring_flows`: the calls, as flows every adapter carries out alike.

Pure: the pika and aio-pika adapters (:mod:`rmqdelay.amqp.journal`) do the I/O. Nothing
is imported here, so that importing one module costs only what it needs.
"""
