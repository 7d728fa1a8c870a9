"""The Nexmark queries as Flink SQL (nexmark/nexmark's Flink texts, over this harness's
columns: snake_case, ``date_time``), for bench/peer_flink.py: those whose result Flink can
write to a file. A filesystem sink takes only appended rows, so the queries whose results
Flink updates (regular aggregates and ranks over a stream: q4, q5, q6, q9, q15-q19) are not
here; every query here appends (projections, filters, regular and window joins, window
aggregates). Each text yields the columns of bench.harness.nexmark_queries' batch twin, in
its order, so that Flink's rows are compared with the batch result as Strata's view is.

Where the text differs from Nexmark's, ``NOTES`` says how.
"""

from __future__ import annotations

from bench.harness.nexmark_streams import COLUMNS, EVENT_TIME

_TYPES = {"bigint": "BIGINT", "text": "STRING", "timestamptz": "TIMESTAMP(3)"}
WATERMARK = "1 hour"  # as bench/nexmark.py's Spark peer
_WATERMARK_SQL = "INTERVAL '1' HOUR"

FLINK_QUERIES: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, date_time, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q3": (
        "SELECT P.name, P.city, P.state, A.id FROM auction AS A INNER JOIN person AS P "
        "ON A.seller = P.id WHERE A.category = 10 AND "
        "(P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')"
    ),
    "q7": (
        "SELECT B.auction, B.price, B.bidder, B.date_time, B1.window_end FROM bid B "
        "JOIN (SELECT MAX(price) AS maxprice, window_start, window_end "
        "FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
        "GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice "
        "WHERE B.date_time >= B1.window_start AND B.date_time < B1.window_end"
    ),
    "q8": (
        "SELECT P.id, P.name, P.starttime FROM (SELECT id, name, window_start AS starttime, "
        "window_end AS endtime FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(date_time), "
        "INTERVAL '10' SECOND)) GROUP BY id, name, window_start, window_end) P "
        "JOIN (SELECT seller, window_start AS starttime, window_end AS endtime "
        "FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(date_time), INTERVAL '10' SECOND)) "
        "GROUP BY seller, window_start, window_end) A "
        "ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime"
    ),
    "q10": (
        "SELECT auction, bidder, price, date_time, extra, "
        "DATE_FORMAT(date_time, 'yyyy-MM-dd') AS dt, DATE_FORMAT(date_time, 'HH:mm') AS hm "
        "FROM bid"
    ),
    "q11": (
        "SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, "
        "window_end AS endtime FROM TABLE(SESSION(TABLE bid PARTITION BY bidder, "
        "DESCRIPTOR(date_time), INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end"
    ),
    "q12": (
        "SELECT bidder, COUNT(*) AS bid_count, window_start AS starttime, "
        "window_end AS endtime FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(date_time), "
        "INTERVAL '10' SECOND)) GROUP BY bidder, window_start, window_end"
    ),
    "q13": (
        "SELECT B.auction, B.bidder, B.price, B.date_time, S.`value` FROM bid B "
        "JOIN side_input S ON MOD(B.auction, 10000) = S.`key`"
    ),
    "q14": (
        "SELECT auction, bidder, 0.908 * price AS price, CASE "
        "WHEN HOUR(date_time) >= 8 AND HOUR(date_time) <= 18 THEN 'dayTime' "
        "WHEN HOUR(date_time) <= 6 OR HOUR(date_time) >= 20 THEN 'nightTime' "
        "ELSE 'otherTime' END AS bid_time_type, date_time, extra, "
        "CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', '')) AS c_counts "
        "FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000"
    ),
    "q20": (
        "SELECT auction, bidder, price, channel, url, B.date_time AS bid_date_time, "
        "B.extra AS bid_extra, item_name, description, initial_bid, reserve, "
        "A.date_time AS auction_date_time, expires, seller, category, A.extra AS auction_extra "
        "FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id WHERE A.category = 10"
    ),
    "q21": (
        "SELECT auction, bidder, price, channel, CASE "
        "WHEN LOWER(channel) = 'apple' THEN '0' WHEN LOWER(channel) = 'google' THEN '1' "
        "WHEN LOWER(channel) = 'facebook' THEN '2' WHEN LOWER(channel) = 'baidu' THEN '3' "
        "ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id FROM bid "
        "WHERE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) IS NOT NULL OR "
        "LOWER(channel) IN ('apple', 'google', 'facebook', 'baidu')"
    ),
    "q22": (
        "SELECT auction, bidder, price, channel, SPLIT_INDEX(url, '/', 3) AS dir1, "
        "SPLIT_INDEX(url, '/', 4) AS dir2, SPLIT_INDEX(url, '/', 5) AS dir3 FROM bid"
    ),
    "q23": (
        "SELECT B.bidder, B.price, B.channel, B.url, B.extra AS bid_extra, P.id AS person_id, "
        "P.name, P.email_address, P.credit_card, P.city, P.state, P.extra AS person_extra, "
        "A.item_name, A.description, A.initial_bid, A.reserve, "
        "A.date_time AS auction_date_time, A.expires, A.seller, A.category, "
        "A.extra AS auction_extra "
        "FROM bid B JOIN person P ON P.id = B.bidder JOIN auction A ON A.seller = B.bidder"
    ),
}
NOTES = {
    "q7": "the bids of each 10-second window at its maximum price, the window's own bids "
    "(Nexmark's BETWEEN also takes a bid at the window's end, the next window's)",
    "q12": "event-time windows, as Strata's (Nexmark's are of processing time)",
    "q13": "the side input is a CSV file, a bounded table joined as it is",
}
SIDE_INPUT_KEYS = 10_000


def source_columns(stream: str) -> str:
    """The Flink columns of a Nexmark stream, and its watermark."""
    columns = ", ".join(f"{name} {_TYPES[kind]}" for name, kind in COLUMNS[stream])
    return f"{columns}, WATERMARK FOR {EVENT_TIME} AS {EVENT_TIME} - {_WATERMARK_SQL}"


def side_input_csv() -> bytes:
    """q13's side input as Flink reads it: key 0-9999 and a value each."""
    return "".join(f"{k},value-{k}\n" for k in range(SIDE_INPUT_KEYS)).encode()
