"""Nexmark's three streams (person, auction, bid), generated deterministically from a seed
in runs that arrive in shuffled order, a chosen share of them hours late: the input of the
Nexmark tests (tests/test_nexmark.py) and benchmark (bench/nexmark.py).

The events follow Nexmark's generator (nexmark/nexmark, ``NexmarkGenerator``) in shape:

* of every 50 events, 1 is a new person, 3 are new auctions and 46 are bids (Nexmark's
  default proportions); person and auction ids count up from 1000, in event order;
* a new auction's seller is one of the last 10 people half the time, else anyone; its
  category is 10 to 14; it expires 10 seconds to 10 minutes after it opens;
* a bid goes to one of the last 10 auctions opened half the time (the hot ones), else to
  any of the last 100, whether or not it has expired, by one of the last 10 people half
  the time, else by anyone; its price is log-uniform from $1 to $1M (in cents); half the
  bids come through one of four named channels (``Apple``, ``Google``, ``Facebook``,
  ``Baidu``), the rest through ``channel-<n>`` with ``channel_id=<n>`` in the URL;
* every event has its own time: event i is at ``i * span_ms / events`` milliseconds into
  the day, so no two rows of a stream share an event time (ORDER BY a time picks one row).

Text holds no commas or quotes, so the runs are plain CSV. Each slice of ``run_events``
consecutive events makes one run per stream that has rows in it; a ``late`` share of each
stream's runs arrives 1 to 6 hours (of event time) after its slice ends, the rest when it
ends, and every arrival is jittered by up to ``jitter_ms``, which shuffles neighbouring
runs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.harness.data import DAY_MS, HOUR_MS, day_timestamp
from bench.harness.lateness import Lateness, arrival_order, pick_late

PERSON, AUCTION, BID = "person", "auction", "bid"
STREAMS = (PERSON, AUCTION, BID)
COLUMNS = {
    PERSON: (
        ("id", "bigint"),
        ("name", "text"),
        ("email_address", "text"),
        ("credit_card", "text"),
        ("city", "text"),
        ("state", "text"),
        ("date_time", "timestamptz"),
        ("extra", "text"),
    ),
    AUCTION: (
        ("id", "bigint"),
        ("item_name", "text"),
        ("description", "text"),
        ("initial_bid", "bigint"),
        ("reserve", "bigint"),
        ("date_time", "timestamptz"),
        ("expires", "timestamptz"),
        ("seller", "bigint"),
        ("category", "bigint"),
        ("extra", "text"),
    ),
    BID: (
        ("auction", "bigint"),
        ("bidder", "bigint"),
        ("price", "bigint"),
        ("channel", "text"),
        ("url", "text"),
        ("date_time", "timestamptz"),
        ("extra", "text"),
    ),
}
EVENT_TIME = "date_time"
PROPORTION = 50  # of every 50 events:
PERSONS = 1  # 1 person,
AUCTIONS = 3  # 3 auctions, and the other 46 are bids
FIRST_ID = 1000
HOT = 10  # the last 10 auctions and people are the hot ones
RECENT_AUCTIONS = 100
CHANNELS = ("Apple", "Google", "Facebook", "Baidu")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones")
CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Seattle")
STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
MIN_OPEN_MS, MAX_OPEN_MS = 10_000, 600_000


def create_statement(stream: str) -> str:
    """The stream's CREATE STREAM: Nexmark's columns, event time ``date_time``."""
    columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS[stream])
    return f"CREATE STREAM {stream} ({columns}) WITH (event_time = '{EVENT_TIME}')"


def header(stream: str) -> str:
    return ",".join(name for name, _ in COLUMNS[stream]) + "\n"


@dataclass(frozen=True)
class Run:
    """One run: the stream it goes to, its CSV body (with a header) and its row count."""

    stream: str
    body: bytes
    rows: int
    late: bool


@dataclass(frozen=True)
class Workload:
    """Every run, in the order they arrive."""

    runs: list[Run]

    @property
    def events(self) -> int:
        return sum(run.rows for run in self.runs)

    def rows(self, stream: str) -> int:
        return sum(run.rows for run in self.runs if run.stream == stream)


class _Generator:
    """The events in time order; people and auctions so far, to pick from."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.people = 0
        self.auctions = 0

    def _word(self, low: int, high: int) -> str:
        return "".join(
            self.rng.choice("abcdefghijklmnopqrstuvwxyz")
            for _ in range(self.rng.randint(low, high))
        )

    def _pick(self, count: int, hot: int, recent: int | None = None) -> int:
        """An id among ``count`` so far: one of the last ``hot`` half the time, else one of
        the last ``recent`` (all when None)."""
        window = hot if self.rng.random() < 0.5 else (recent or count)
        return FIRST_ID + count - 1 - self.rng.randrange(min(window, count))

    def person(self, at_ms: int) -> list[str]:
        rng = self.rng
        key = FIRST_ID + self.people
        self.people += 1
        name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
        card = " ".join(f"{rng.randrange(10_000):04d}" for _ in range(4))
        email = f"{self._word(3, 8)}@{self._word(3, 8)}.com"
        city, state = rng.choice(CITIES), rng.choice(STATES)
        return [str(key), name, email, card, city, state, day_timestamp(at_ms), self._word(0, 12)]

    def auction(self, at_ms: int) -> list[str]:
        rng = self.rng
        key = FIRST_ID + self.auctions
        self.auctions += 1
        initial = self._price()
        expires = at_ms + rng.randint(MIN_OPEN_MS, MAX_OPEN_MS)
        return [
            str(key),
            f"item {self._word(3, 8)}",
            self._word(5, 20),
            str(initial),
            str(initial + self._price()),
            day_timestamp(at_ms),
            day_timestamp(expires),
            str(self._pick(self.people, HOT)),
            str(10 + rng.randrange(5)),
            self._word(0, 12),
        ]

    def bid(self, at_ms: int) -> list[str]:
        rng = self.rng
        if rng.random() < 0.5:
            channel = rng.choice(CHANNELS)
            url = f"https://www.nexmark.com/{channel.lower()}/{self._word(2, 5)}/item.htm?query=1"
        else:
            number = rng.randrange(10_000)
            channel = f"channel-{number}"
            url = (
                f"https://www.nexmark.com/{self._word(2, 5)}/{self._word(2, 5)}/"
                f"{self._word(2, 5)}/item.htm?query=1&channel_id={number}"
            )
        return [
            str(self._pick(self.auctions, HOT, RECENT_AUCTIONS)),
            str(self._pick(self.people, HOT)),
            str(self._price()),
            channel,
            url,
            day_timestamp(at_ms),
            self._word(0, 12),
        ]

    def _price(self) -> int:
        """Log-uniform from 100 cents to 100,000,000 cents, as Nexmark's nextPrice."""
        return round(10 ** (self.rng.random() * 6) * 100)


def generate(
    events: int,
    run_events: int,
    seed: int,
    *,
    late: float = 0.2,
    span_ms: int = 6 * HOUR_MS,
    jitter_ms: int = HOUR_MS // 2,
) -> Workload:
    """``events`` events over the first ``span_ms`` of the day (bench.harness.data.DAY),
    in runs of ``run_events`` consecutive events per stream, ``late`` of each stream's runs
    arriving 1 to 6 hours late."""
    if not 0 < span_ms <= DAY_MS - MAX_OPEN_MS - 6 * HOUR_MS:
        raise ValueError(f"span_ms must leave every event and expiry in the day: {span_ms}")
    if span_ms < events:
        raise ValueError("every event needs its own millisecond: span_ms >= events")
    rng = random.Random(seed)
    generator = _Generator(rng)
    runs: list[tuple[str, list[str]]] = []
    slice_ends: list[int] = []
    for start in range(0, events, run_events):
        end = min(start + run_events, events)
        lines: dict[str, list[str]] = {stream: [] for stream in STREAMS}
        for event in range(start, end):
            at_ms = event * span_ms // events
            kind = event % PROPORTION
            if kind < PERSONS or generator.people == 0:
                row, stream = generator.person(at_ms), PERSON
            elif kind < PERSONS + AUCTIONS or generator.auctions == 0:
                row, stream = generator.auction(at_ms), AUCTION
            else:
                row, stream = generator.bid(at_ms), BID
            lines[stream].append(",".join(row) + "\n")
        for stream in STREAMS:
            if lines[stream]:
                runs.append((stream, lines[stream]))
                slice_ends.append(end * span_ms // events)
    profile = Lateness(runs=late, rows=0.0, delay_ms=(HOUR_MS, 6 * HOUR_MS), jitter_ms=jitter_ms)
    late_runs: set[int] = set()
    for stream in STREAMS:  # the share of each stream's runs
        mine = [i for i, (s, _) in enumerate(runs) if s == stream]
        late_runs.update(mine[n] for n in pick_late(rng, len(mine), profile))
    order = arrival_order(slice_ends, late_runs, profile, rng)
    return Workload(
        [
            Run(
                runs[i][0],
                (header(runs[i][0]) + "".join(runs[i][1])).encode(),
                len(runs[i][1]),
                i in late_runs,
            )
            for i in order
        ]
    )
