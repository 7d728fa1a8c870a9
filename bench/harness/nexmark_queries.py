"""The 24 Nexmark queries (q0-q23, nexmark/nexmark's Flink texts) as Strata streams over
bench.harness.nexmark_streams, each with its batch twin: the same query in plain
PostgreSQL over the raw streams' views, which a view must equal at every instant.

Where Strata's SQL differs from the Flink text, ``note`` says how and why; the meaning is
Nexmark's except where the note says otherwise (q12, q13). Column names are
snake_case (``date_time``, ``item_name``). A query made of several streams lists them in
order; its view is the last one's. ``SIDE_INPUT`` is q13's PostgreSQL table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SIDE_INPUT = "side_input"
SIDE_INPUT_KEYS = 10_000


@dataclass(frozen=True)
class Query:
    name: str  # q0 .. q23, and the name of the stream whose view is the result
    what: str  # Nexmark's description
    streams: tuple[str, ...]  # CREATE STREAM statements, in order; the last is `name`
    batch: str  # the same result as a batch query over the raw views
    note: str = ""  # how Strata's text differs from Nexmark's, and why

    @property
    def view(self) -> str:
        return f"SELECT * FROM {self.name}"

    @property
    def inputs(self) -> tuple[str, ...]:
        """The raw streams the query reads, in Nexmark's order (person, auction, bid)."""
        read = set(_READS.findall(" ".join(self.streams)))
        return tuple(s for s in ("person", "auction", "bid") if s in read)


_READS = re.compile(r"(?:FROM|JOIN|TUMBLE\(|HOP\(|SESSION\()\s*(person|auction|bid)\b")


def side_input_statements() -> list[str]:
    """q13's side input, a PostgreSQL table: key 0-9999 and a value each."""
    return [
        f"CREATE TABLE {SIDE_INPUT} (key bigint PRIMARY KEY, value text NOT NULL)",
        f"INSERT INTO {SIDE_INPUT} SELECT k, 'value-' || k FROM generate_series(0, "
        f"{SIDE_INPUT_KEYS - 1}) k",
    ]


def _tumble(stream: str, size: str) -> str:
    """A raw stream's rows with their tumbling window, for the batch twins."""
    return (
        f"(SELECT *, date_bin(INTERVAL '{size}', date_time, timestamptz 'epoch') AS "
        f"window_start, date_bin(INTERVAL '{size}', date_time, timestamptz 'epoch') + "
        f"INTERVAL '{size}' AS window_end FROM {stream})"
    )


_RANKS = """count(*) AS total_bids,
  count(*) FILTER (WHERE price < 10000) AS rank1_bids,
  count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
  count(*) FILTER (WHERE price >= 1000000) AS rank3_bids"""
_DISTINCT = """count(DISTINCT bidder) AS total_bidders,
  count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
  count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
  count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
  count(DISTINCT auction) AS total_auctions,
  count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
  count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
  count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"""
_DAY = "to_char(date_time AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
_MINUTE = "to_char(date_time AT TIME ZONE 'UTC', 'HH24:MI')"
_HOUR = "extract(hour FROM date_time AT TIME ZONE 'UTC')"
_WINNERS = (
    "SELECT max(b.price) AS final, a.category FROM auction a JOIN bid b "
    "ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires "
    "GROUP BY a.id, a.category"
)
_Q9_INNER = """SELECT a.id, a.item_name, a.description, a.initial_bid, a.reserve, a.date_time,
    a.expires, a.seller, a.category, a.extra, b.auction, b.bidder, b.price,
    b.date_time AS bid_date_time, b.extra AS bid_extra,
    ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.date_time) AS rownum
  FROM auction a JOIN bid b ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires"""
_Q6 = """SELECT seller, avg(price) OVER (PARTITION BY seller ORDER BY date_time
    ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) AS avg_price
FROM (SELECT id, seller, price, date_time FROM (SELECT a.id, a.seller, b.price, b.date_time,
    ROW_NUMBER() OVER (PARTITION BY a.id, a.seller ORDER BY b.price DESC, b.date_time) AS rownum
  FROM auction a JOIN bid b ON a.id = b.auction AND b.date_time BETWEEN a.date_time AND a.expires
  ) r WHERE rownum <= 1) q"""
_Q14 = f"""SELECT auction, bidder, 0.908 * price AS price,
  CASE WHEN {_HOUR} BETWEEN 8 AND 18 THEN 'dayTime'
       WHEN {_HOUR} <= 6 OR {_HOUR} >= 20 THEN 'nightTime'
       ELSE 'otherTime' END AS bid_time_type,
  date_time, extra, length(extra) - length(replace(extra, 'c', '')) AS c_counts
FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"""
_CHANNEL_ID = "(regexp_match(url, '(&|^)channel_id=([^&]*)'))[2]"
_Q21 = f"""SELECT auction, bidder, price, channel,
  CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
       WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
       ELSE {_CHANNEL_ID} END AS channel_id
FROM bid WHERE {_CHANNEL_ID} IS NOT NULL
  OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')"""
_Q23 = """SELECT b.bidder, b.price, b.channel, b.url, b.extra AS bid_extra, p.id AS person_id,
  p.name, p.email_address, p.credit_card, p.city, p.state, p.extra AS person_extra,
  a.item_name, a.description, a.initial_bid, a.reserve, a.date_time AS auction_date_time,
  a.expires, a.seller, a.category, a.extra AS auction_extra
FROM bid b JOIN person p ON p.id = b.bidder JOIN auction a ON a.seller = b.bidder"""
_SESSIONS = """SELECT bidder, count(*) AS bid_count, min(date_time) AS starttime,
  max(date_time) + INTERVAL '10 seconds' AS endtime
FROM (SELECT bidder, date_time, sum(fresh) OVER (PARTITION BY bidder ORDER BY date_time) AS s
      FROM (SELECT bidder, date_time, CASE WHEN date_time - lag(date_time) OVER
              (PARTITION BY bidder ORDER BY date_time) < INTERVAL '10 seconds'
              THEN 0 ELSE 1 END AS fresh FROM bid) marked) numbered
GROUP BY bidder, s"""
_HOPS = """(SELECT b.*, w AS window_start, w + INTERVAL '10 seconds' AS window_end FROM bid b,
  generate_series(date_bin(INTERVAL '2 seconds', b.date_time, timestamptz 'epoch')
  - INTERVAL '8 seconds', date_bin(INTERVAL '2 seconds', b.date_time, timestamptz 'epoch'),
  INTERVAL '2 seconds') w)"""


QUERIES: tuple[Query, ...] = (
    Query(
        "q0",
        "pass through",
        ("CREATE STREAM q0 AS SELECT auction, bidder, price, date_time, extra FROM bid",),
        "SELECT auction, bidder, price, date_time, extra FROM bid",
    ),
    Query(
        "q1",
        "currency conversion",
        (
            "CREATE STREAM q1 AS SELECT auction, bidder, 0.908 * price AS price, date_time, "
            "extra FROM bid",
        ),
        "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid",
    ),
    Query(
        "q2",
        "selection",
        ("CREATE STREAM q2 AS SELECT auction, price FROM bid WHERE mod(auction, 123) = 0",),
        "SELECT auction, price FROM bid WHERE mod(auction, 123) = 0",
    ),
    Query(
        "q3",
        "local item suggestion",
        (
            "CREATE STREAM q3 AS SELECT p.name, p.city, p.state, a.id FROM auction a "
            "JOIN person p ON a.seller = p.id "
            "WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')",
        ),
        "SELECT p.name, p.city, p.state, a.id FROM auction a JOIN person p "
        "ON a.seller = p.id WHERE a.category = 10 AND p.state IN ('OR', 'ID', 'CA')",
    ),
    Query(
        "q4",
        "average price per category",
        (
            f"CREATE STREAM q4 AS SELECT q.category, avg(q.final) AS avg_final "
            f"FROM ({_WINNERS}) q GROUP BY q.category",
        ),
        f"SELECT q.category, avg(q.final) FROM ({_WINNERS}) q GROUP BY q.category",
    ),
    Query(
        "q5",
        "hot items: the auctions with the most bids in each 10-second window, every 2 s",
        (
            "CREATE STREAM q5 AS SELECT auction, num, window_start AS starttime, "
            "window_end AS endtime FROM (SELECT auction, num, window_start, window_end, "
            "RANK() OVER (PARTITION BY window_start ORDER BY num DESC) AS r FROM ("
            "SELECT auction, count(*) AS num, window_start, window_end FROM HOP(bid, "
            "date_time, INTERVAL '2 seconds', INTERVAL '10 seconds') "
            "GROUP BY auction, window_start, window_end) c) t WHERE r = 1",
        ),
        "SELECT auction, num, window_start, window_end FROM (SELECT auction, num, "
        "window_start, window_end, RANK() OVER (PARTITION BY window_start ORDER BY num DESC) "
        "AS r FROM (SELECT auction, count(*) AS num, window_start, window_end "
        f"FROM {_HOPS} h GROUP BY auction, window_start, window_end) c) t WHERE r = 1",
        "Nexmark joins each window's counts with their maximum; the top-1 by RANK is the "
        "same set of rows",
    ),
    Query(
        "q6",
        "average selling price by seller: the mean of each seller's last 11 winning bids",
        (f"CREATE STREAM q6 AS {_Q6}",),
        _Q6,
        "as Flink's text; ties in price are broken by time, so that the winning bid is determined",
    ),
    Query(
        "q7",
        "highest bid in each 10-second window",
        (
            "CREATE STREAM q7 AS SELECT auction, price, bidder, date_time, window_end "
            "FROM (SELECT auction, price, bidder, date_time, window_end, RANK() OVER "
            "(PARTITION BY window_start ORDER BY price DESC) AS r "
            "FROM TUMBLE(bid, date_time, INTERVAL '10 seconds') x) t WHERE r = 1",
        ),
        "SELECT auction, price, bidder, date_time, window_end FROM (SELECT auction, price, "
        "bidder, date_time, window_end, RANK() OVER (PARTITION BY window_start "
        f"ORDER BY price DESC) AS r FROM {_tumble('bid', '10 seconds')} x) t WHERE r = 1",
        "Nexmark joins the bids with each window's maximum price; the top-1 by RANK is the "
        "same set of rows",
    ),
    Query(
        "q8",
        "new users who opened an auction in the 10 seconds they registered in",
        (
            "CREATE STREAM q8 AS SELECT p.id, p.name, p.window_start AS starttime "
            "FROM TUMBLE(person, date_time, INTERVAL '10 seconds') p "
            "JOIN TUMBLE(auction, date_time, INTERVAL '10 seconds') a "
            "ON p.id = a.seller AND p.window_start = a.window_start "
            "GROUP BY p.id, p.name, p.window_start",
        ),
        f"SELECT p.id, p.name, p.window_start FROM {_tumble('person', '10 seconds')} p "
        f"JOIN {_tumble('auction', '10 seconds')} a ON p.id = a.seller "
        "AND p.window_start = a.window_start GROUP BY p.id, p.name, p.window_start",
        "Nexmark groups each side by window before joining; grouping the window join "
        "gives the same rows",
    ),
    Query(
        "q9",
        "winning bids: each auction's highest bid in its lifetime",
        (f"CREATE STREAM q9 AS SELECT * FROM ({_Q9_INNER}) t WHERE rownum <= 1",),
        f"SELECT * FROM ({_Q9_INNER}) t WHERE rownum <= 1",
    ),
    Query(
        "q10",
        "log to file system: each bid with its day and minute",
        (
            f"CREATE STREAM q10 AS SELECT auction, bidder, price, date_time, extra, {_DAY} "
            f"AS dt, {_MINUTE} AS hm FROM bid",
        ),
        f"SELECT auction, bidder, price, date_time, extra, {_DAY} AS dt, {_MINUTE} AS hm FROM bid",
        "a stream with the partition columns instead of a file sink; DATE_FORMAT is to_char",
    ),
    Query(
        "q11",
        "user sessions: bids per bidder per session with a 10-second gap",
        (
            "CREATE STREAM q11 AS SELECT bidder, count(*) AS bid_count, window_start AS "
            "starttime, window_end AS endtime FROM SESSION(bid, date_time, "
            "INTERVAL '10 seconds') GROUP BY bidder, window_start, window_end",
        ),
        _SESSIONS,
    ),
    Query(
        "q12",
        "bids per bidder per 10-second window",
        (
            "CREATE STREAM q12 AS SELECT bidder, count(*) AS bid_count, window_start AS "
            "starttime, window_end AS endtime FROM TUMBLE(bid, date_time, "
            "INTERVAL '10 seconds') GROUP BY bidder, window_start, window_end",
        ),
        "SELECT bidder, count(*), window_start, window_end FROM "
        f"{_tumble('bid', '10 seconds')} b GROUP BY bidder, window_start, window_end",
        "windows of event time: Nexmark's processing-time windows (PROCTIME()) depend on "
        "when a row is processed, which no batch query can repeat",
    ),
    Query(
        "q13",
        "bounded side input join",
        (
            f"CREATE STREAM q13 AS SELECT b.auction, b.bidder, b.price, b.date_time, "
            f"s.value FROM bid b JOIN {SIDE_INPUT} s ON mod(b.auction, 10000) = s.key",
        ),
        f"SELECT b.auction, b.bidder, b.price, b.date_time, s.value FROM bid b "
        f"JOIN {SIDE_INPUT} s ON mod(b.auction, 10000) = s.key",
        "the side input is a PostgreSQL table, joined with its current content (Nexmark "
        "looks it up as of processing time)",
    ),
    Query(
        "q14",
        "calculation: price in euro, time of day, count of a character",
        (f"CREATE STREAM q14 AS {_Q14}",),
        _Q14,
        "the UDF count_char(extra, 'c') is length(extra) - length(replace(extra, 'c', '')); "
        "HOUR() is extract(hour FROM date_time AT TIME ZONE 'UTC')",
    ),
    Query(
        "q15",
        "bidding statistics per day",
        (
            f"CREATE STREAM q15 AS SELECT {_DAY} AS day, {_RANKS}, {_DISTINCT} FROM bid "
            f"GROUP BY {_DAY}",
        ),
        f"SELECT {_DAY} AS day, {_RANKS}, {_DISTINCT} FROM bid GROUP BY {_DAY}",
    ),
    Query(
        "q16",
        "channel statistics per day",
        (
            f"CREATE STREAM q16 AS SELECT channel, {_DAY} AS day, max({_MINUTE}) AS minute, "
            f"{_RANKS}, {_DISTINCT} FROM bid GROUP BY channel, {_DAY}",
        ),
        f"SELECT channel, {_DAY} AS day, max({_MINUTE}) AS minute, {_RANKS}, {_DISTINCT} "
        f"FROM bid GROUP BY channel, {_DAY}",
    ),
    Query(
        "q17",
        "auction statistics per day",
        (
            f"CREATE STREAM q17 AS SELECT auction, {_DAY} AS day, {_RANKS}, min(price) AS "
            "min_price, max(price) AS max_price, avg(price) AS avg_price, sum(price) AS "
            f"sum_price FROM bid GROUP BY auction, {_DAY}",
        ),
        f"SELECT auction, {_DAY} AS day, {_RANKS}, min(price), max(price), avg(price), "
        f"sum(price) FROM bid GROUP BY auction, {_DAY}",
    ),
    Query(
        "q18",
        "each bidder's last bid on each auction",
        (
            "CREATE STREAM q18 AS SELECT auction, bidder, price, channel, url, date_time, "
            "extra FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction "
            "ORDER BY date_time DESC) AS rank_number FROM bid) t WHERE rank_number <= 1",
        ),
        "SELECT auction, bidder, price, channel, url, date_time, extra FROM (SELECT *, "
        "ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY date_time DESC) AS "
        "rank_number FROM bid) t WHERE rank_number <= 1",
    ),
    Query(
        "q19",
        "each auction's 10 highest bids",
        (
            "CREATE STREAM q19 AS SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY "
            "auction ORDER BY price DESC, date_time) AS rank_number FROM bid) t "
            "WHERE rank_number <= 10",
        ),
        "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price "
        "DESC, date_time) AS rank_number FROM bid) t WHERE rank_number <= 10",
        "ties in price are broken by time, so that which 10 rows are kept is determined",
    ),
    Query(
        "q20",
        "expand bids with their auction (category 10)",
        (
            "CREATE STREAM q20 AS SELECT b.auction, b.bidder, b.price, b.channel, b.url, "
            "b.date_time AS bid_date_time, b.extra AS bid_extra, a.item_name, "
            "a.description, a.initial_bid, a.reserve, a.date_time AS auction_date_time, "
            "a.expires, a.seller, a.category, a.extra AS auction_extra "
            "FROM bid b JOIN auction a ON b.auction = a.id WHERE a.category = 10",
        ),
        "SELECT b.auction, b.bidder, b.price, b.channel, b.url, b.date_time, b.extra, "
        "a.item_name, a.description, a.initial_bid, a.reserve, a.date_time, a.expires, "
        "a.seller, a.category, a.extra FROM bid b JOIN auction a ON b.auction = a.id "
        "WHERE a.category = 10",
    ),
    Query(
        "q21",
        "add a channel id",
        (f"CREATE STREAM q21 AS {_Q21}",),
        _Q21,
        "Flink's REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is PostgreSQL's "
        "(regexp_match(url, '(&|^)channel_id=([^&]*)'))[2], the same pattern",
    ),
    Query(
        "q22",
        "get URL directories",
        (
            "CREATE STREAM q22 AS SELECT auction, bidder, price, channel, "
            "split_part(url, '/', 4) AS dir1, split_part(url, '/', 5) AS dir2, "
            "split_part(url, '/', 6) AS dir3 FROM bid",
        ),
        "SELECT auction, bidder, price, channel, split_part(url, '/', 4), "
        "split_part(url, '/', 5), split_part(url, '/', 6) FROM bid",
        "SPLIT_INDEX counts from 0, split_part from 1",
    ),
    Query("q23", "join of all three streams", (f"CREATE STREAM q23 AS {_Q23}",), _Q23),
)
