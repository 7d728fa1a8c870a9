"""Kill -9 of the server while a batch of bids commits, for the SQL shapes that run as
written since the Nexmark queries came in as their project writes them: a group key
extracted with a regex alternation (q21: Spark computes it per run, with PostgreSQL's
meaning), an aggregate over two streams and a table in one statement (its companion join
stream, then the aggregate joining it with the table), windowed aggregates as subqueries
joined (q5: the counts joined with their maximum, itself over a subquery; q7: the bids
joined with each window's maximum price) and a ranking over a join selecting ``a.*`` (q9).
After the restart, and the runs the server never took posted again, every run sent is
archived once (the ledger's set check) and every view equals its batch query over the
raw rows. A stream calling the user's SQL function (inlined) is among them, one
deduplicating with DISTINCT ON, q7 written with WITH, a window call over a common
table expression, an IN (subquery), a correlated one, a NOT IN, a correlated one, an
EXISTS, an uncorrelated one, a NOT EXISTS, a scalar subquery, a correlated one and a
ROLLUP."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.crash import (
    Ledger,
    arm,
    assert_pending_when_struck,
    check_ledger,
    disarm,
    fired,
    wait_until_settled,
)
from tests.oracle import canonical
from tests.test_e2e import Server

pytestmark = pytest.mark.e2e

START = datetime(2024, 9, 1, tzinfo=UTC)
CHANNEL_ID = "(regexp_match(url, '(&|^)channel_id=([^&]*)'))[2]"
STREAMS = (
    "CREATE STREAM bid (auction integer, price integer, url text, t timestamptz) "
    "WITH (event_time = 't')",
    "CREATE STREAM auction (id integer, category integer, t timestamptz) WITH (event_time = 't')",
    f"CREATE STREAM by_channel AS SELECT {CHANNEL_ID} AS channel_id, count(*) AS bids, "
    f"sum(price) AS total, window_start FROM TUMBLE(bid, t, INTERVAL '1 hour') "
    f"GROUP BY {CHANNEL_ID}, window_start",
    "CREATE STREAM per_label AS SELECT c.label, count(*) AS n, sum(b.price) AS s, "
    "window_end FROM TUMBLE(bid, t, INTERVAL '10 minutes') b "
    "JOIN auction a ON b.auction = a.id JOIN dim c ON a.category = c.id "
    "GROUP BY c.label, window_end",
    # q5 as Nexmark writes it: the counts per hopping window joined with their maximum.
    "CREATE STREAM q5 AS SELECT AuctionBids.auction, AuctionBids.num FROM (SELECT auction, "
    "count(*) AS num, window_start AS starttime, window_end AS endtime FROM HOP(bid, t, "
    "INTERVAL '20 minutes', INTERVAL '1 hour') GROUP BY auction, window_start, window_end) "
    "AS AuctionBids JOIN (SELECT max(CountBids.num) AS maxn, CountBids.starttime, "
    "CountBids.endtime FROM (SELECT count(*) AS num, window_start AS starttime, window_end "
    "AS endtime FROM HOP(bid, t, INTERVAL '20 minutes', INTERVAL '1 hour') GROUP BY auction, "
    "window_start, window_end) AS CountBids GROUP BY CountBids.starttime, CountBids.endtime) "
    "AS MaxBids ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = "
    "MaxBids.endtime AND AuctionBids.num >= MaxBids.maxn",
    # q7 as Nexmark writes it: the bids with their window's highest price.
    "CREATE STREAM q7 AS SELECT B.auction, B.price, B.url, B.t FROM bid B JOIN (SELECT "
    "MAX(price) AS maxprice, window_end AS t FROM TUMBLE(bid, t, INTERVAL '10 minutes') "
    "GROUP BY window_start, window_end) B1 ON B.price = B1.maxprice "
    "WHERE B.t BETWEEN B1.t - INTERVAL '10 minutes' AND B1.t",
    # A function of the user's (q14's shape), inlined into the partial and final forms.
    "CREATE STREAM by_band AS SELECT price_band(price) AS band, count(*) AS n, "
    "sum(price_band(price)) AS banded, window_start FROM TUMBLE(bid, t, INTERVAL '1 hour') "
    "GROUP BY price_band(price), window_start",
    # q9 as Nexmark writes it: each auction's highest bid, the auction's columns by a.*.
    "CREATE STREAM q9 AS SELECT * FROM (SELECT a.*, b.auction, b.price, b.url, b.t AS bid_t, "
    "ROW_NUMBER() OVER (PARTITION BY a.id ORDER BY b.price DESC, b.t, b.url) AS rownum "
    "FROM auction a JOIN bid b ON a.id = b.auction AND b.t BETWEEN a.t AND "
    "a.t + INTERVAL '1 hour') x WHERE rownum <= 1",
    # q7 written with WITH, the window's maximum a common table expression naming its
    # columns (inlined as the subquery joined).
    "CREATE STREAM q7w AS WITH B1 (maxprice, t) AS (SELECT MAX(price), window_end "
    "FROM TUMBLE(bid, t, INTERVAL '10 minutes') GROUP BY window_start, window_end) "
    "SELECT B.auction, B.price, B.url, B.t FROM bid B JOIN B1 ON B.price = B1.maxprice "
    "WHERE B.t BETWEEN B1.t - INTERVAL '10 minutes' AND B1.t",
    # A window call over a common table expression (made a stream with this one).
    "CREATE STREAM dear_hourly AS WITH dear AS (SELECT auction, price, t FROM bid "
    "WHERE price > 50) SELECT auction, count(*) AS n, sum(price) AS s, window_start "
    "FROM TUMBLE(dear, t, INTERVAL '1 hour') GROUP BY auction, window_start",
    # IN (subquery): a semi-join with the subquery's distinct values.
    "CREATE STREAM on_dear AS SELECT auction, price, t FROM bid WHERE auction IN "
    "(SELECT auction FROM bid WHERE price > 90) AND price < 50",
    # EXISTS: a semi-join with the auctions' distinct keys.
    "CREATE STREAM in_category AS SELECT b.auction, b.price, b.t FROM bid b WHERE EXISTS "
    "(SELECT 1 FROM auction a WHERE a.id = b.auction AND a.category = 2)",
    # A correlated IN: the EXISTS it means, a semi-join on (category, id % 5).
    "CREATE STREAM same_mod5 AS SELECT a.id, a.category, a.t FROM auction a WHERE a.category "
    "IN (SELECT a2.category FROM auction a2 WHERE a2.id % 5 = a.id % 5 AND a2.id <> 3)",
    # A correlated NOT IN: the anti-join on (category, id % 5), counted per id % 5.
    "CREATE STREAM odd_mod5 AS SELECT a.id, a.category, a.t FROM auction a WHERE a.category "
    "NOT IN (SELECT a2.category FROM auction a2 WHERE a2.id % 5 = a.id % 5 AND a2.id > 50)",
    # NOT EXISTS: an anti-join with the bids' distinct keys.
    "CREATE STREAM unsold AS SELECT a.id, a.category, a.t FROM auction a WHERE NOT EXISTS "
    "(SELECT 1 FROM bid b WHERE b.auction = a.id AND b.price > 80)",
    # NOT IN: the anti-join with the subquery's counts (its NULL meaning).
    "CREATE STREAM not_cheap AS SELECT auction, price, t FROM bid WHERE auction NOT IN "
    "(SELECT auction FROM bid WHERE price < 5)",
    # A scalar subquery: the one-row average, cross-joined.
    "CREATE STREAM above_avg AS SELECT auction, price, t FROM bid "
    "WHERE price > (SELECT avg(price) FROM bid) + 20",
    # A correlated scalar subquery: each auction's average, grouped, LEFT JOINed.
    "CREATE STREAM above_own AS SELECT auction, price, t FROM bid b WHERE price > "
    "(SELECT avg(c.price) FROM bid c WHERE c.auction = b.auction) + 10",
    # EXISTS not correlated, under OR: the count of its rows above 0, cross-joined.
    "CREATE STREAM any_top AS SELECT auction, price, t FROM bid WHERE EXISTS "
    "(SELECT 1 FROM bid WHERE price > 95) OR price < 10",
    # ROLLUP: a stream per grouping set, their union read together.
    "CREATE STREAM by_rollup AS SELECT auction % 3 AS a3, price / 25 AS band, count(*) AS n, "
    "sum(price) AS s, GROUPING(auction % 3, price / 25) AS g, window_start FROM TUMBLE(bid, "
    "t, INTERVAL '1 hour') GROUP BY window_start, ROLLUP (auction % 3, price / 25)",
    # PostgreSQL's dedup: each auction's last bid, deduplicated on read.
    "CREATE STREAM last_bid AS SELECT DISTINCT ON (auction) auction, price, url, t FROM bid "
    "ORDER BY auction, t DESC, price DESC, url DESC",
)
_HOPS = (
    "(SELECT b.*, w AS starttime, w + INTERVAL '1 hour' AS endtime FROM bid b, "
    "generate_series(date_bin('20 minutes', b.t, timestamptz 'epoch') - INTERVAL '40 minutes', "
    "date_bin('20 minutes', b.t, timestamptz 'epoch'), INTERVAL '20 minutes') w)"
)
_COUNTS = (
    f"SELECT auction, count(*) AS num, starttime, endtime FROM {_HOPS} h "
    "GROUP BY auction, starttime, endtime"
)
TABLE = (
    "CREATE TABLE dim (id integer PRIMARY KEY, label text)",
    "INSERT INTO dim SELECT k, 'l' || (k % 2) FROM generate_series(0, 3) k",
    "CREATE FUNCTION price_band(p integer) RETURNS integer LANGUAGE sql IMMUTABLE "
    "RETURN (p / 25) * 25",
)
ORACLES = {
    "SELECT channel_id, bids, total, window_start FROM by_channel": (
        f"SELECT {CHANNEL_ID}, count(*), sum(price), date_bin('1 hour', t, timestamptz "
        f"'epoch') FROM bid GROUP BY 1, 4"
    ),
    "SELECT label, n, s, window_end FROM per_label": (
        "SELECT c.label, count(*), sum(b.price), "
        "date_bin('10 minutes', b.t, timestamptz 'epoch') + interval '10 minutes' "
        "FROM bid b JOIN auction a ON b.auction = a.id JOIN dim c ON a.category = c.id "
        "GROUP BY 1, 4"
    ),
    "SELECT band, n, banded, window_start FROM by_band": (
        "SELECT price_band(price), count(*), sum(price_band(price)), date_bin('1 hour', t, "
        "timestamptz 'epoch') FROM bid GROUP BY 1, 4"
    ),
    "SELECT * FROM q5": (
        f"SELECT ab.auction, ab.num FROM ({_COUNTS}) ab JOIN (SELECT max(num) AS maxn, "
        f"starttime, endtime FROM ({_COUNTS}) c GROUP BY starttime, endtime) mb "
        "ON ab.starttime = mb.starttime AND ab.endtime = mb.endtime AND ab.num >= mb.maxn"
    ),
    "SELECT * FROM q7": (
        "SELECT b.auction, b.price, b.url, b.t FROM bid b JOIN (SELECT max(price) AS maxprice, "
        "date_bin('10 minutes', t, timestamptz 'epoch') + INTERVAL '10 minutes' AS t FROM bid "
        "GROUP BY 2) b1 ON b.price = b1.maxprice "
        "WHERE b.t BETWEEN b1.t - INTERVAL '10 minutes' AND b1.t"
    ),
    "SELECT * FROM q7w": (
        "SELECT b.auction, b.price, b.url, b.t FROM bid b JOIN (SELECT max(price) AS maxprice, "
        "date_bin('10 minutes', t, timestamptz 'epoch') + INTERVAL '10 minutes' AS t FROM bid "
        "GROUP BY 2) b1 ON b.price = b1.maxprice "
        "WHERE b.t BETWEEN b1.t - INTERVAL '10 minutes' AND b1.t"
    ),
    "SELECT * FROM dear_hourly": (
        "SELECT auction, count(*), sum(price), date_bin('1 hour', t, timestamptz 'epoch') "
        "FROM bid WHERE price > 50 GROUP BY 1, 4"
    ),
    "SELECT * FROM on_dear": (
        "SELECT auction, price, t FROM bid WHERE auction IN "
        "(SELECT auction FROM bid WHERE price > 90) AND price < 50"
    ),
    "SELECT * FROM q9": (
        "SELECT * FROM (SELECT a.*, b.auction, b.price, b.url, b.t AS bid_t, ROW_NUMBER() OVER "
        "(PARTITION BY a.id ORDER BY b.price DESC, b.t, b.url) AS rownum FROM auction a JOIN "
        "bid b ON a.id = b.auction AND b.t BETWEEN a.t AND a.t + INTERVAL '1 hour') x "
        "WHERE rownum <= 1"
    ),
    "SELECT * FROM same_mod5": (
        "SELECT a.id, a.category, a.t FROM auction a WHERE a.category "
        "IN (SELECT a2.category FROM auction a2 WHERE a2.id % 5 = a.id % 5 AND a2.id <> 3)"
    ),
    "SELECT * FROM odd_mod5": (
        "SELECT a.id, a.category, a.t FROM auction a WHERE a.category "
        "NOT IN (SELECT a2.category FROM auction a2 WHERE a2.id % 5 = a.id % 5 AND a2.id > 50)"
    ),
    "SELECT * FROM in_category": (
        "SELECT b.auction, b.price, b.t FROM bid b WHERE EXISTS "
        "(SELECT 1 FROM auction a WHERE a.id = b.auction AND a.category = 2)"
    ),
    "SELECT * FROM unsold": (
        "SELECT a.id, a.category, a.t FROM auction a WHERE NOT EXISTS "
        "(SELECT 1 FROM bid b WHERE b.auction = a.id AND b.price > 80)"
    ),
    "SELECT * FROM not_cheap": (
        "SELECT auction, price, t FROM bid WHERE auction NOT IN "
        "(SELECT auction FROM bid WHERE price < 5)"
    ),
    "SELECT * FROM above_avg": (
        "SELECT auction, price, t FROM bid WHERE price > (SELECT avg(price) FROM bid) + 20"
    ),
    "SELECT * FROM above_own": (
        "SELECT auction, price, t FROM bid b WHERE price > "
        "(SELECT avg(c.price) FROM bid c WHERE c.auction = b.auction) + 10"
    ),
    "SELECT * FROM any_top": (
        "SELECT auction, price, t FROM bid WHERE EXISTS "
        "(SELECT 1 FROM bid WHERE price > 95) OR price < 10"
    ),
    "SELECT * FROM by_rollup": (
        "SELECT auction % 3, price / 25, count(*), sum(price), GROUPING(auction % 3, price / 25), "
        "date_bin('1 hour', t, timestamptz 'epoch') FROM bid GROUP BY date_bin('1 hour', t, "
        "timestamptz 'epoch'), ROLLUP (auction % 3, price / 25)"
    ),
    "SELECT * FROM last_bid": (
        "SELECT auction, price, url, t FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction "
        "ORDER BY t DESC, price DESC, url DESC) AS k FROM bid) b WHERE k = 1"
    ),
}
URLS = (
    "https://www.nexmark.com/a?channel_id={}",
    "https://www.nexmark.com/a?x=1&channel_id={}&y=2",
    "https://www.nexmark.com/a?channel_idx={}",
)


def _bids(rng: random.Random) -> str:
    rows = [
        {
            "auction": rng.randrange(12),
            "price": rng.randrange(1, 100),
            "url": rng.choice(URLS).format(rng.randrange(5)),
            "t": (START + timedelta(seconds=rng.randrange(7200))).isoformat(),
        }
        for _ in range(rng.randrange(20, 60))
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


def _auctions(rng: random.Random, first: int) -> str:
    rows = [
        {
            "id": first + i,
            "category": rng.randrange(5),  # category 4 has no label: its bids join nothing
            "t": (START + timedelta(seconds=rng.randrange(7200))).isoformat(),
        }
        for i in range(4)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows)


@pytest.mark.slow  # about 100 s: a server started twice, seven views checked
def test_kill_while_a_batch_of_bids_commits(tmp_path: Path) -> None:
    rng = random.Random(9)
    trigger = "bids-trigger"
    server = Server(tmp_path / "data")
    arm(server, f"in_pg_write:server:{trigger}")
    server.start()
    ledger = Ledger()
    try:
        client = httpx.Client(base_url=server.url, timeout=60)
        with psycopg.connect(server.database_url, autocommit=True) as connection:
            for statement in TABLE:
                connection.execute(statement)  # type: ignore[arg-type]
        for statement in STREAMS:
            client.post("/streams", json={"sql": statement}).raise_for_status()
        for i in range(3):  # every auction, then bids
            assert ledger.post(
                server.url, f"auctions-{i}", _auctions(rng, 4 * i), wait=True, stream="auction"
            )
        for i in range(4):
            assert ledger.post(server.url, f"before-{i}", _bids(rng), wait=True, stream="bid")
        # The trigger commits while runs of both streams keep arriving.
        waiting = threading.Thread(
            target=ledger.post,
            args=(server.url, trigger, _bids(rng)),
            kwargs={"wait": True, "stream": "bid"},
        )
        waiting.start()
        for i in range(6):
            time.sleep(0.2)
            if i == 3:
                body, stream = _auctions(rng, 100), "auction"
            else:
                body, stream = _bids(rng), "bid"
            ledger.post(server.url, f"during-{i}", body, wait=False, stream=stream)
        waiting.join()
        assert server.process is not None
        assert server.process.wait(timeout=60) == -signal.SIGKILL
        strike = fired(server, "in_pg_write", trigger, within=60)
        assert trigger in strike["keys"]
        disarm(server)
        server.start()
        client = httpx.Client(base_url=server.url, timeout=60)
        # Every acknowledged run commits without a retry; the others are posted again with
        # their run ids (what the server took commits once).
        found = wait_until_settled(client, set(ledger.bodies))
        assert {found[r] for r in ledger.acknowledged} == {"committed"}, found
        assert set(found.values()) <= {"committed", "unknown"}, found
        for run_id, (stream, body) in sorted(ledger.bodies.items()):
            assert ledger.post(server.url, run_id, body, wait=True, stream=stream), run_id
        assert_pending_when_struck(server, strike, trigger)
        # The set check: every run sent is archived once, whole.
        totals = check_ledger(server.database_url, ledger)
        for stream in ("bid", "auction"):
            sent = sum(body.count("\n") for s, body in ledger.bodies.values() if s == stream)
            assert totals[stream] == sent, stream
        with psycopg.connect(server.database_url) as connection:
            connection.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for view, oracle in ORACLES.items():
                got = canonical(connection.execute(view).fetchall())  # type: ignore[arg-type]
                want = canonical(connection.execute(oracle).fetchall())  # type: ignore[arg-type]
                assert got and got == want, view
            channels = {row[0] for row in connection.execute("SELECT channel_id FROM by_channel")}
            assert None in channels and len(channels) > 2  # ids extracted, and none found
    finally:
        server.close()
