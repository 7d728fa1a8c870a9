"""The change feed: every change of a derived stream's view, in commit order, each once,
at a position a client resumes from (GET /streams/{name}/changes).

Invariant: the changes of a followed stream, applied in position order to its rows as the
feed last announced them, give the view as it is in PostgreSQL after the transaction that
took the last position. Three things keep it:

- *Announced rows.* ``feed_rows`` holds the view as announced so far. Every transaction
  that can change the view (a run's commit, a serial repair, an ALTER's swap) reads the
  view rows it may have changed *after* its own writes, compares them with the announced
  rows of the same windows, appends the differences to ``feed_changes`` and updates
  ``feed_rows``, all in its own transaction: a change is announced if and only if it
  commits. A step that changes no result (a reducer's fold, a serial materialization)
  is not hooked at all, so it can announce nothing.
- *Positions in commit order.* Those transactions lock the stream's ``feeds`` row
  (FOR UPDATE, after every other lock they take) and number their changes from its
  counter: two of them cannot interleave, the second numbers after the first, and a
  reader never sees position 11 committed while 10 is still to come. No sequence is used.
- *Following from the first subscriber.* A stream's feed starts when a client first asks
  for it: ``follow`` takes SHARE locks on the raw archives (no run commits meanwhile),
  copies the whole view into ``feed_rows`` and creates the ``feeds`` row at position 0.
  Streams nobody follows cost a commit one indexed lookup. Once followed, a stream stays
  followed until it is dropped; positions then resume exactly, as far back as
  ``feed_retention`` keeps changes (410 beyond, with the oldest position kept).

A stream joining PostgreSQL tables on read changes when a table does, in a user's
transaction: a trigger counts those changes (server/feed/tables.py), and the feed compares
the whole view when the count moves (cause ``table``), at a subscriber's poll or before a
run of the stream's sources commits (and again after a commit's own announcement, for a
table change committed meanwhile).

An ALTER swapped by the swapper is announced in the swap's transaction (cause ``alter``);
one swapped at once (an ALTER that reuses the archives) is announced by the next
transaction that touches the feed: a run's commit or a subscriber's poll. A stream that is
back-filling (being created, or created again under a followed name) changes its view
with every chunk: a feed does not start then (503), and a followed name is left alone
until the back-fill is done, then its whole view is compared at once (cause ``create``).

Lateness: a change of a run's commit is *late* when the watermark of the raw stream the
runs came to had passed the end of the row's window before the commit (runs committed
together in one batch count as one arrival).
"""

from server.feed.read import Change, Feed, open_feed
from server.feed.record import (
    follow,
    follow_definitions,
    follow_tables,
    record_repair,
    recording,
    refusal,
)

__all__ = [
    "Change",
    "Feed",
    "follow",
    "follow_definitions",
    "follow_tables",
    "open_feed",
    "record_repair",
    "recording",
    "refusal",
]
