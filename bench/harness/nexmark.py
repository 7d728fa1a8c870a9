"""The Nexmark-shaped auction workload (bench/joins.py): auctions and the bids on them,
generated deterministically (seeded), in runs of each stream that arrive late as a
profile of bench.harness.lateness says; and the two raw streams in Strata.

Rows, as Nexmark's ``auction`` and ``bid`` (without its ``person`` stream, and with one
new auction every 10 events rather than Nexmark's 3 in 49, so that there are enough
auction runs for some of them to be late too):

* ``auction``: ``id`` (0, 1, 2, ... in event-time order), ``seller``, ``category`` (10-14),
  ``item_name``, ``date_time`` (when it opens) and ``expires``, 1 to 30 minutes later;
* ``bid``: ``auction``, ``bidder``, ``price`` (in cents) and ``date_time``. Half the bids go
  to an auction opened in the last minute (the hot ones), the rest to any opened in the
  last 30 minutes, whether or not it has expired: some bids match no auction in a join
  on the auction's open interval.

The events are spread evenly over the span; each slice of ``run_rows`` consecutive events
makes two runs (CSV bodies), its auctions and its bids, which arrive when the slice ends,
each on its own: the lateness profile's share of each stream's runs is late.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

import httpx

from bench.harness.api import create_stream
from bench.harness.data import DAY_MS, Dataset, day_timestamp
from bench.harness.lateness import Lateness, arrival_order, pick_late

AUCTION = "auction"
BID = "bid"
COLUMNS = {
    AUCTION: "id bigint, seller bigint, category integer, item_name text, "
    "date_time timestamptz, expires timestamptz",
    BID: "auction bigint, bidder bigint, price bigint, date_time timestamptz",
}
HEADERS = {
    AUCTION: "id,seller,category,item_name,date_time,expires\n",
    BID: "auction,bidder,price,date_time\n",
}
AUCTION_EVERY = 10  # one event in 10 opens an auction
MIN_OPEN_MS = 60_000
MAX_OPEN_MS = 30 * 60_000  # an auction expires at most this long after it opens
HOT_MS = 60_000  # half the bids go to an auction opened this recently


@dataclass(frozen=True)
class Auctions:
    """When each auction opened (its id is its index), to choose auctions for bids."""

    opened_ms: list[int]

    def pick(self, rng: random.Random, at_ms: int) -> int:
        """The auction a bid at ``at_ms`` goes to: one opened in the last minute half the
        time, else one opened in the last 30 minutes (the latest if there is none)."""
        latest = bisect.bisect_right(self.opened_ms, at_ms) - 1
        if latest < 0:
            return 0
        recent = HOT_MS if rng.random() < 0.5 else MAX_OPEN_MS
        first = bisect.bisect_left(self.opened_ms, at_ms - recent)
        return rng.randint(min(first, latest), latest)


@dataclass(frozen=True)
class Workload:
    """Runs of both streams in the order they arrive, and the auctions bids can go to."""

    runs: Dataset  # every run, in arrival order
    streams: list[str]  # the stream of each run (AUCTION or BID)
    auctions: Auctions
    span_ms: int

    def of(self, stream: str) -> Dataset:
        """The runs of ``stream`` alone, in arrival order."""
        mine = [i for i, s in enumerate(self.streams) if s == stream]
        late = set(self.runs.late_runs)
        return Dataset(
            [self.runs.bodies[i] for i in mine],
            [self.runs.rows_per_body[i] for i in mine],
            [n for n, i in enumerate(mine) if i in late],
        )


def auction_line(rng: random.Random, key: int, at_ms: int) -> str:
    expires = at_ms + rng.randint(MIN_OPEN_MS, MAX_OPEN_MS)
    seller = rng.randrange(1, 10_000)
    category = 10 + rng.randrange(5)
    return f"{key},{seller},{category},item {key},{day_timestamp(at_ms)},{day_timestamp(expires)}\n"


def bid_line(rng: random.Random, auctions: Auctions, at_ms: int) -> str:
    auction = auctions.pick(rng, at_ms)
    bidder = rng.randrange(1, 100_000)
    price = rng.randrange(100, 1_000_000)
    return f"{auction},{bidder},{price},{day_timestamp(at_ms)}\n"


def generate(rows: int, run_rows: int, seed: int, lateness: Lateness, span_ms: int) -> Workload:
    """``rows`` events (auctions and bids) over the first ``span_ms`` of the day, two runs
    per slice of ``run_rows`` events, in arrival order as ``lateness`` says (its share of
    the runs of each stream late)."""
    if not 0 < span_ms <= DAY_MS - MAX_OPEN_MS:
        raise ValueError(f"span_ms must leave the auctions within one day, not {span_ms}")
    rng = random.Random(seed)
    opened: list[int] = []
    auctions = Auctions(opened)  # filled as the events are generated, in time order
    bodies: list[bytes] = []
    counts: list[int] = []
    streams: list[str] = []
    slice_ends: list[int] = []
    for start in range(0, rows, run_rows):
        lines: dict[str, list[str]] = {AUCTION: [], BID: []}
        for event in range(start, min(start + run_rows, rows)):
            at_ms = event * span_ms // rows
            if not opened or rng.randrange(AUCTION_EVERY) == 0:
                lines[AUCTION].append(auction_line(rng, len(opened), at_ms))
                opened.append(at_ms)
            else:
                lines[BID].append(bid_line(rng, auctions, at_ms))
        for stream, csv in lines.items():
            if csv:
                bodies.append((HEADERS[stream] + "".join(csv)).encode())
                counts.append(len(csv))
                streams.append(stream)
                slice_ends.append(min(start + run_rows, rows) * span_ms // rows)
    late: set[int] = set()
    for stream in (AUCTION, BID):  # a share of each stream's runs, and so of its rows
        runs_of = [i for i, s in enumerate(streams) if s == stream]
        late.update(runs_of[n] for n in pick_late(rng, len(runs_of), lateness))
    order = arrival_order(slice_ends, late, lateness, rng)
    runs = Dataset(
        [bodies[i] for i in order],
        [counts[i] for i in order],
        [n for n, i in enumerate(order) if i in late],
    )
    return Workload(runs, [streams[i] for i in order], Auctions(list(opened)), span_ms)


def bid_run(auctions: Auctions, seed: int, start_ms: int, end_ms: int, rows: int) -> bytes:
    """A run (CSV body) of ``rows`` bids spread evenly over ``[start_ms, end_ms)``, on the
    auctions of that time."""
    rng = random.Random(seed)
    lines = [HEADERS[BID]]
    for n in range(rows):
        lines.append(bid_line(rng, auctions, start_ms + n * (end_ms - start_ms) // rows))
    return "".join(lines).encode()


def create_streams(client: httpx.Client, prefix: str = "") -> None:
    """The raw streams ``<prefix>auction`` and ``<prefix>bid``, their event time
    ``date_time``."""
    for stream, columns in COLUMNS.items():
        create_stream(
            client, f"CREATE STREAM {prefix}{stream} ({columns}) WITH (event_time = 'date_time')"
        )
