"""The SQL port with the clients people use: the real psql (-c, -f scripts, \\copy),
psycopg in the simple and the extended protocol, SQLAlchemy and pgbench, against an
in-process Strata (real PostgreSQL, real Spark).

Every COPY and INSERT into a stream is one run: the tests check the archive after each
answer, that errors leave nothing, and that a run id answers the same twice.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors as pg_errors

from server.catalog import sqlalchemy_url
from server.engines.embedded_pg import POSTGRES_BIN_PATH
from server.security import READER_ROLE, configure_reader
from tests.conftest import Strata
from tests.test_e2e import wait_until

PSQL = POSTGRES_BIN_PATH / "psql"
PGBENCH = POSTGRES_BIN_PATH / "pgbench"

ROWS_CSV = (
    "campaign,user_id,price,t\n"
    "shoes,1,0.25,2026-11-21T10:00:05Z\n"
    "shoes,2,0.30,2026-11-21T10:00:40Z\n"
    "books,3,0.10,2026-11-21T10:01:10Z\n"
)


def raw_stream(name: str) -> str:
    return (
        f"CREATE STREAM {name} (campaign text, user_id bigint, price numeric(12,4), "
        "t timestamptz) WITH (event_time = 't')"
    )


def count_stream(name: str, source: str) -> str:
    return (
        f"CREATE STREAM {name} AS SELECT campaign, count(*) AS c, sum(price) AS revenue, "
        f"window_end AS t FROM TUMBLE({source}, t, INTERVAL '1 minute') "
        "GROUP BY campaign, window_end"
    )


def psql(
    url: str, *args: str, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """The real psql: no psqlrc, stop at the first error, answers as text."""
    result = subprocess.run(
        [str(PSQL), url, "-X", "-v", "ON_ERROR_STOP=1", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def as_role(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


@pytest.fixture
def names() -> Iterator[tuple[str, str]]:
    """Fresh names for a raw stream and a stream counting it: the module shares a server."""
    suffix = uuid.uuid4().hex[:8]
    yield f"imp_{suffix}", f"cnt_{suffix}"


@pytest.fixture
def streams(module_strata: Strata, names: tuple[str, str]) -> tuple[str, str]:
    raw, count = names
    module_strata.create(raw_stream(raw))
    module_strata.create(count_stream(count, raw))
    return raw, count


def archived(strata: Strata, raw: str) -> int:
    return int(strata.query(f"SELECT count(*) FROM {raw}")[0][0])


def running_query(strata: Strata, marker: str) -> int | None:
    """The pid of the PostgreSQL backend running a query whose text has ``marker``, if any
    (asked of PostgreSQL directly, not through the port)."""
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        found = connection.execute(
            "SELECT pid FROM pg_stat_activity WHERE state = 'active' "
            "AND pid <> pg_backend_pid() AND strpos(query, %s) > 0",
            (marker,),
        ).fetchone()
    return None if found is None else int(found[0])


def backend_gone(strata: Strata, pid: int) -> bool:
    with psycopg.connect(strata.database_url, autocommit=True) as connection:
        found = connection.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
        return found.fetchone() is None


def runs_of(strata: Strata, raw: str) -> int:
    return int(
        strata.query("SELECT count(*) FROM strata_catalog.runs WHERE stream = %s", raw)[0][0]
    )


# ---- psql ------------------------------------------------------------------------------


def test_psql_runs_strata_statements_and_passes_the_rest(
    module_strata: Strata, names: tuple[str, str]
) -> None:
    url = module_strata.psql_url
    raw, count = names
    assert psql(url, "-c", raw_stream(raw)).stdout.strip() == "CREATE STREAM"
    assert psql(url, "-c", count_stream(count, raw)).stdout.strip() == "CREATE STREAM"
    shown = psql(url, "-At", "-F", "|", "-c", "SHOW STREAMS").stdout.splitlines()
    assert f"{raw}|raw|||{raw_stream(raw)}" in shown
    assert f"{count}|derived|PP|{raw}|{count_stream(count, raw)}" in shown
    plan = psql(url, "-At", "-c", f"EXPLAIN STREAM {count}").stdout
    assert f"Derived stream {count} (PP)" in plan and "Partial query (Spark, per run)" in plan
    # Not Strata's: PostgreSQL answers, the \d family included.
    assert psql(url, "-At", "-c", "SELECT 40 + 2").stdout.strip() == "42"
    described = psql(url, "-c", f"\\d {raw}").stdout
    assert f'View "public.{raw}"' in described and "numeric(12,4)" in described
    assert psql(url, "-At", "-c", "SELECT current_user").stdout.strip() == "postgres"
    # DROP STREAM, IF EXISTS with PostgreSQL's notice.
    refused = psql(url, "-c", f"DROP STREAM {raw}", check=False)
    assert refused.returncode != 0 and f"used by {count}" in refused.stderr
    assert psql(url, "-c", f"DROP STREAM {count}").stdout.strip() == "DROP STREAM"
    gone = psql(url, "-c", f"DROP STREAM IF EXISTS {count}")
    assert f"NOTICE:  stream '{count}' does not exist, skipping" in gone.stderr
    assert [r for r in module_strata.service.streams() if r in (raw, count)] == [raw]


def test_psql_script_and_copy_are_runs(
    module_strata: Strata, streams: tuple[str, str], tmp_path: Path
) -> None:
    raw, count = streams
    url = module_strata.psql_url
    data = tmp_path / "impressions.csv"
    data.write_text(ROWS_CSV)
    script = tmp_path / "load.sql"
    script.write_text(
        f"\\copy {raw} FROM '{data}' WITH (FORMAT csv, HEADER, RUN_ID 'batch-1')\n"
        f"SELECT campaign, c, revenue FROM {count} ORDER BY t, campaign;\n"
    )
    out = psql(url, "-At", "-F", ",", "-f", str(script)).stdout.splitlines()
    assert out == ["COPY 3", "shoes,2,0.5500", "books,1,0.1000"]
    # The same run id again: the first answer, nothing more archived.
    again = psql(
        url, "-c", f"\\copy {raw} FROM '{data}' WITH (FORMAT csv, HEADER, RUN_ID 'batch-1')"
    )
    assert again.stdout.strip() == "COPY 3"
    assert archived(module_strata, raw) == 3 and runs_of(module_strata, raw) == 1
    # psql's input, text format (tabs, \N), and the old option syntax.
    text = "shoes\t7\t0.20\t2026-11-21 10:00:59+00\nbooks\t\\N\t\\N\t2026-11-21 10:01:30+00\n"
    out = psql(url, "-c", f"\\copy {raw} FROM pstdin", stdin=text)
    assert out.stdout.strip() == "COPY 2"
    out = psql(
        url,
        "-c",
        f"\\copy {raw} (t, campaign) FROM pstdin CSV",
        stdin="2026-11-21T10:02:00Z,hats\n",
    )
    assert out.stdout.strip() == "COPY 1"
    rows = module_strata.query(f"SELECT campaign, c FROM {count} ORDER BY t, campaign")
    assert rows == [("shoes", 3), ("books", 2), ("hats", 1)]


def test_copy_errors_name_line_column_and_value_and_archive_nothing(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, _ = streams
    url = module_strata.psql_url
    bad = ROWS_CSV + "books,4,abc,2026-11-21T10:01:20Z\n"
    result = psql(
        url, "-c", f"\\copy {raw} FROM pstdin WITH (FORMAT csv, HEADER)", stdin=bad, check=False
    )
    # The very text HTTP gives for the same body (lines counted with the header).
    http = module_strata.post_run(raw, bad, csv=True)
    assert http.status_code == 400
    assert f"ERROR:  {http.json()['error']}" in result.stderr
    assert "line 5, column 'price': not a number (value: 'abc')" in result.stderr
    with psycopg.connect(module_strata.psql_url, autocommit=True) as connection:
        with (
            pytest.raises(pg_errors.BadCopyFileFormat) as raised,
            connection.cursor().copy(f"COPY {raw} FROM STDIN (FORMAT csv)") as copy,
        ):
            copy.write("shoes,1,0.25\n")
        assert (
            raised.value.diag.message_primary == "line 1, column 't': missing data for column 't'"
        )
        assert raised.value.diag.column_name == "t"
        # The connection is fine after the error.
        assert connection.execute("SELECT 1").fetchone() == (1,)
    assert archived(module_strata, raw) == 0 and runs_of(module_strata, raw) == 0


def test_ddl_errors_carry_a_position_for_the_caret(
    module_strata: Strata, names: tuple[str, str]
) -> None:
    raw, _ = names
    url = module_strata.psql_url
    statement = (
        f"CREATE STREAM {raw} AS SELECT campaign, count(*) AS c, window_end "
        f"FROM TUMBLE(nowhere_{raw}, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
    )
    result = psql(url, "-c", f"SELECT 1;\n{statement}", check=False)
    assert result.returncode != 0
    with (
        psycopg.connect(url, autocommit=True) as connection,
        pytest.raises(psycopg.Error) as raised,
    ):
        connection.execute(statement)
    diag = raised.value.diag
    assert diag.sqlstate == "42P01"  # an unknown source is an undefined table
    # The message is HTTP's, with the rewriter's line and column; the position is that place.
    assert diag.message_primary is not None
    column = int(diag.message_primary.split("column ", 1)[1].split(":", 1)[0])
    assert diag.message_primary.startswith(f"line 1, column {column}: stream 'nowhere_{raw}'")
    assert diag.statement_position == str(column)
    # psql draws the caret under the same place, in a script of two statements too.
    assert "LINE 2:" in result.stderr and "^" in result.stderr
    with psycopg.connect(url, autocommit=True) as connection:
        with pytest.raises(pg_errors.UndefinedTable) as unknown:
            connection.execute(f"ALTER STREAM {raw} AS SELECT 1")
        assert "does not exist" in str(unknown.value)
        with pytest.raises(pg_errors.UndefinedTable):
            connection.execute(f"EXPLAIN STREAM {raw}")


def test_insert_values_is_one_run(module_strata: Strata, streams: tuple[str, str]) -> None:
    raw, count = streams
    url = module_strata.psql_url
    out = psql(
        url,
        "-c",
        f"INSERT INTO {raw} VALUES ('shoes', 1, 0.25, '2026-11-21T10:00:05Z'), "
        "('shoes', 2, 0.30::numeric, timestamptz '2026-11-21 10:00:40+00'), "
        "('books', NULL, -0.5e-1, '2026-11-21T10:01:10Z')",
    )
    assert out.stdout.strip() == "INSERT 0 3"
    assert runs_of(module_strata, raw) == 1
    assert module_strata.query(f"SELECT campaign, c FROM {count} ORDER BY t, campaign") == [
        ("shoes", 2),
        ("books", 1),
    ]
    bad = psql(
        url,
        "-c",
        f"INSERT INTO {raw} (campaign, t, price) VALUES ('a', '2026-11-21T10:00:00Z', 1), "
        "('b', '2026-11-21T10:00:00Z', 'abc')",
        check=False,
    )
    assert "ERROR:  row 2, column 'price': not a number (value: 'abc')" in bad.stderr
    assert "^" in bad.stderr
    with psycopg.connect(url, autocommit=True) as connection:
        with pytest.raises(pg_errors.FeatureNotSupported):
            connection.execute(f"INSERT INTO {raw} VALUES ('a', 1, now(), now())")
        with pytest.raises(pg_errors.FeatureNotSupported):
            connection.execute(f"INSERT INTO {raw} SELECT * FROM {raw}")
    assert archived(module_strata, raw) == 3 and runs_of(module_strata, raw) == 1


# ---- transactions and roles ---------------------------------------------------------


def test_a_transaction_block_refuses_strata_statements_and_rolls_back(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, _ = streams
    with psycopg.connect(module_strata.psql_url) as connection:  # psycopg opens a transaction
        connection.execute("CREATE TEMP TABLE scratch (x int)")
        connection.execute("INSERT INTO scratch VALUES (1)")
        with pytest.raises(pg_errors.ActiveSqlTransaction) as raised:
            connection.execute(f"INSERT INTO {raw} VALUES ('a', 1, 1, '2026-11-21T10:00:00Z')")
        assert "cannot run inside a transaction block" in str(raised.value)
        # The transaction is aborted, as after any error: nothing of it commits.
        with pytest.raises(pg_errors.InFailedSqlTransaction):
            connection.execute("SELECT 1")
        connection.rollback()
        with (
            pytest.raises(pg_errors.ActiveSqlTransaction),
            connection.cursor().copy(f"COPY {raw} FROM STDIN") as copy,
        ):
            copy.write("a\t1\t1\t2026-11-21T10:00:00Z\n")
        connection.rollback()
        connection.autocommit = True
        # The table of the failed transaction was rolled back with it.
        assert connection.execute("SELECT to_regclass('pg_temp.scratch')").fetchone() == (None,)
    # psql: the stream's COPY is refused inside BEGIN ... COMMIT, and COMMIT rolls back.
    commands = [
        "BEGIN",
        "CREATE TEMP TABLE t2 (x int)",
        f"COPY {raw} FROM STDIN",
        "COMMIT",
        "SELECT count(*) FROM pg_tables WHERE tablename = 't2'",
    ]
    result = subprocess.run(
        [str(PSQL), module_strata.psql_url, "-X", "-At", *(f"-c{c}" for c in commands)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "cannot run inside a transaction block" in result.stderr
    assert result.stdout.splitlines()[-2:] == ["ROLLBACK", "0"]
    assert archived(module_strata, raw) == 0 and runs_of(module_strata, raw) == 0


def test_the_reader_role_reads_but_cannot_create_or_load(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, count = streams
    configure_reader(module_strata.service.engine, "reader-pw")
    try:
        reader = as_role(module_strata.psql_url, READER_ROLE, "reader-pw")  # SCRAM, relayed
        with psycopg.connect(reader, autocommit=True) as connection:
            assert connection.execute("SELECT current_user").fetchone() == (READER_ROLE,)
            assert connection.execute(f"SELECT count(*) FROM {count}").fetchone() == (0,)
            shown = {row[0] for row in connection.execute("SHOW STREAMS").fetchall()}
            assert {raw, count} <= shown
            for statement in (
                raw_stream(f"{raw}_x"),
                f"DROP STREAM {count}",
                f"INSERT INTO {raw} VALUES ('a', 1, 1, '2026-11-21T10:00:00Z')",
            ):
                with pytest.raises(pg_errors.InsufficientPrivilege):
                    connection.execute(statement)
            with (
                pytest.raises(pg_errors.InsufficientPrivilege),
                connection.cursor().copy(f"COPY {raw} FROM STDIN") as copy,
            ):
                copy.write("a\t1\t1\t2026-11-21T10:00:00Z\n")
        bad = as_role(module_strata.psql_url, READER_ROLE, "wrong")
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(bad).close()
    finally:
        configure_reader(module_strata.service.engine, None)
    assert archived(module_strata, raw) == 0 and count in module_strata.service.streams()


# ---- psycopg: the extended protocol -----------------------------------------------------


def test_psycopg_extended_protocol_prepared_and_pipelined(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, count = streams
    row = ("shoes", 1, Decimal("0.25"), "2026-11-21T10:00:05Z")
    with psycopg.connect(module_strata.psql_url, autocommit=True) as connection:
        # Parameters in text format, then prepared (named statement, reused).
        insert = f"INSERT INTO {raw} VALUES (%s, %s, %s, %s)"
        connection.execute(insert, row)
        for user in (2, 3):
            connection.execute(
                insert, ("books", user, Decimal("0.5"), "2026-11-21T10:01:00Z"), prepare=True
            )
        # Binary parameters.
        connection.execute(
            f"INSERT INTO {raw} (campaign, user_id, price, t) VALUES (%b, %b, %b, %b)",
            ("hats", 4, Decimal("1.5"), "2026-11-21T10:02:00Z"),
        )
        assert connection.execute(f"SELECT count(*) FROM {raw}").fetchone() == (4,)
        # A pipeline mixing SELECTs, PostgreSQL's statements and Strata's.
        with connection.pipeline():
            first = connection.execute(f"SELECT count(*) FROM {raw}")
            connection.execute(insert, ("socks", 5, Decimal("2"), "2026-11-21T10:03:00Z"))
            second = connection.execute(f"SELECT count(*) FROM {raw}")
            shown = connection.execute("SHOW STREAMS")
        assert first.fetchone() == (4,) and second.fetchone() == (5,)
        assert raw in {r[0] for r in shown.fetchall()}
        # An error in the pipeline skips what follows it up to the sync, as PostgreSQL does.
        with pytest.raises(pg_errors.InvalidTextRepresentation), connection.pipeline():
            connection.execute(insert, ("bad", 6, "abc", "2026-11-21T10:03:00Z"))
            connection.execute(insert, ("never", 7, Decimal("1"), "2026-11-21T10:03:00Z"))
        assert connection.execute(f"SELECT count(*) FROM {raw}").fetchone() == (5,)
        # COPY through psycopg (text format rows), with a run id, twice.
        for _ in range(2):
            with connection.cursor().copy(f"COPY {raw} FROM STDIN WITH (RUN_ID 'ps-1')") as copy:
                copy.write_row(("shoes", 8, Decimal("0.75"), "2026-11-21T10:04:00Z"))
                copy.write_row(("shoes", 9, None, "2026-11-21T10:04:30Z"))
        # Client-side binding: the simple protocol.
        simple = psycopg.ClientCursor(connection)
        simple.execute(insert, ("shoes", 10, Decimal("1"), "2026-11-21T10:05:00Z"))
        assert simple.statusmessage == "INSERT 0 1"
        simple.execute(f"SHOW STREAMS; SELECT count(*) FROM {raw}")
        assert raw in {r[0] for r in simple.fetchall()}
        assert simple.nextset() and simple.fetchone() == (8,)
    assert runs_of(module_strata, raw) == 7
    assert module_strata.query(f"SELECT sum(c) FROM {count}") == [(8,)]


def test_sqlalchemy_reflects_and_queries_through_the_port(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, count = streams
    psql(module_strata.psql_url, "-c", f"\\copy {raw} FROM pstdin CSV HEADER", stdin=ROWS_CSV)
    engine = sa.create_engine(sqlalchemy_url(module_strata.psql_url))
    try:
        inspector = sa.inspect(engine)
        assert {raw, count} <= set(inspector.get_view_names())
        view = sa.Table(count, sa.MetaData(), autoload_with=engine)
        assert [c.name for c in view.columns] == ["campaign", "c", "revenue", "t"]
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(view.c.campaign, view.c.c).order_by(view.c.t, view.c.campaign)
            ).all()
        assert [tuple(r) for r in rows] == [("shoes", 2), ("books", 1)]
    finally:
        engine.dispose()


def test_pgbench_select_only_through_the_port(module_strata: Strata) -> None:
    url = module_strata.psql_url
    # Initialising pgbench's tables is PostgreSQL's own COPY, through the port.
    init = subprocess.run(
        [str(PGBENCH), "-i", "-s", "1", "-q", url], capture_output=True, text=True, timeout=300
    )
    assert init.returncode == 0, init.stderr
    for mode in ("simple", "extended", "prepared"):
        bench = subprocess.run(
            [str(PGBENCH), "-S", "-n", "-c", "4", "-j", "2", "-t", "200", "-M", mode, url],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert bench.returncode == 0, bench.stderr
        assert "number of transactions actually processed: 800/800" in bench.stdout
        assert "number of failed transactions: 0" in bench.stdout


# ---- robustness ------------------------------------------------------------------------


def _startup(port: int, url: str) -> socket.socket:
    """A raw connection through the startup, as the user of ``url`` (a psql_url), with its
    password if the server asks for one (SCRAM-SHA-256, as the embedded PostgreSQL does)."""
    return _startup_with_pid(port, url)[0]


def _startup_with_pid(port: int, url: str) -> tuple[socket.socket, int]:
    """_startup's connection, and the pid of the PostgreSQL backend behind it (from the
    BackendKeyData, which the port relays as PostgreSQL sent it)."""
    parts = urlsplit(url)
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    parameters = f"user\0{parts.username}\0database\0{parts.path.lstrip('/')}\0\0".encode()
    connection.sendall(struct.pack("!ii", 8 + len(parameters), 3 << 16) + parameters)
    (kind, body), *_ = _read_until(connection, b"R")
    if struct.unpack("!i", body[:4])[0] == 10:  # AuthenticationSASL
        _scram(connection, unquote(parts.password or ""))
    ready = _read_until(connection, b"Z")
    pid = next(struct.unpack("!i", body[:4])[0] for kind, body in ready if kind == b"K")
    return connection, pid


def _scram(connection: socket.socket, password: str) -> None:
    """The client's side of SCRAM-SHA-256 (RFC 5802), up to the server's final message."""
    nonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = f"n=,r={nonce}"
    first = ("n,," + first_bare).encode()
    connection.sendall(_message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    (_, body), *_ = _read_until(connection, b"R")
    server_first = body[4:].decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    final_bare = f"c=biws,r={fields['r']}"
    signature = hmac.digest(
        hashlib.sha256(client_key).digest(),
        f"{first_bare},{server_first},{final_bare}".encode(),
        "sha256",
    )
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    connection.sendall(_message(b"p", f"{final_bare},p={proof.decode()}".encode()))


def _read_until(connection: socket.socket, kind: bytes) -> list[tuple[bytes, bytes]]:
    """The messages up to the first of type ``kind``."""
    messages = []
    buffer = b""
    while True:
        while len(buffer) < 5 or len(buffer) < 1 + struct.unpack("!i", buffer[1:5])[0]:
            chunk = connection.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed before a {kind!r} message: {messages}")
            buffer += chunk
        size = struct.unpack("!i", buffer[1:5])[0]
        messages.append((buffer[:1], buffer[5 : 1 + size]))
        buffer = buffer[1 + size :]
        if messages[-1][0] == kind:
            return messages


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def test_a_client_leaving_mid_copy_leaves_nothing(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, _ = streams
    port = module_strata.runtime.sql_port.port
    assert port is not None
    connection, backend = _startup_with_pid(port, module_strata.psql_url)
    connection.sendall(_message(b"Q", f"COPY {raw} FROM STDIN (FORMAT csv, HEADER)\0".encode()))
    assert _read_until(connection, b"G")[-1][0] == b"G"
    connection.sendall(_message(b"d", ROWS_CSV.encode()))
    connection.close()  # no CopyDone
    # The port has ended that session (its PostgreSQL connection closed) and no run is on
    # its way into the pipeline: whatever it would have done with the data, it has done.
    wait_until(
        lambda: backend_gone(module_strata, backend) and module_strata.service.pipeline.idle,
        "the port to end the session of the client that left mid-COPY",
        timeout=60,
    )
    assert archived(module_strata, raw) == 0 and runs_of(module_strata, raw) == 0
    # CopyFail: the client gives up; PostgreSQL's error and nothing archived.
    connection = _startup(port, module_strata.psql_url)
    connection.sendall(_message(b"Q", f"COPY {raw} FROM STDIN (FORMAT csv)\0".encode()))
    _read_until(connection, b"G")
    connection.sendall(
        _message(b"d", b"a,1,1,2026-11-21T10:00:00Z\n") + _message(b"f", b"changed my mind\0")
    )
    answer = _read_until(connection, b"Z")
    assert answer[0][0] == b"E" and b"57014" in answer[0][1] and b"changed my mind" in answer[0][1]
    connection.close()
    assert archived(module_strata, raw) == 0 and runs_of(module_strata, raw) == 0


def test_malformed_messages_close_that_connection_only(module_strata: Strata) -> None:
    port = module_strata.runtime.sql_port.port
    assert port is not None
    with psycopg.connect(module_strata.psql_url, autocommit=True) as bystander:
        garbage = [
            b"\x00\x00\x00\x03",  # a startup packet shorter than its length field
            struct.pack("!i", 1 << 30) + b"x" * 8,  # a huge startup packet
            struct.pack("!ii", 8, 1234 << 16),  # protocol 1234.0
        ]
        for packet in garbage:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
                connection.sendall(packet)
                connection.shutdown(socket.SHUT_WR)
                while connection.recv(65536):
                    pass  # the port answers (or not) and closes
        # A broken frame ends the connection; a malformed body is answered with PostgreSQL's
        # protocol violation (08P01), by the port or by PostgreSQL, whichever reads it.
        after_startup = [
            b"Q" + struct.pack("!i", 2),  # a length below 4
            _message(b"P", b"no terminators"),  # Parse without its strings
            _message(b"P", b"\0COPY x FROM STDIN"),  # one the port reads: no terminator
            _message(b"D", b"X\0"),  # Describe of neither a statement nor a portal
        ]
        for message in after_startup:
            connection = _startup(port, module_strata.psql_url)
            connection.sendall(message + _message(b"S", b""))
            answer = _read_until(connection, b"E")[-1]
            assert b"C08P01\0" in answer[1]
            connection.close()
        assert bystander.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(module_strata.psql_url) as fresh:
        assert fresh.execute("SELECT 2").fetchone() == (2,)


def test_cancel_requests_reach_postgresql(module_strata: Strata) -> None:
    # psql sends a CancelRequest on Ctrl-C (SIGINT): sent once PostgreSQL runs the query.
    marker = f"cancel_{uuid.uuid4().hex[:12]}"
    sleeper = subprocess.Popen(
        [str(PSQL), module_strata.psql_url, "-X", "-c", f"SELECT pg_sleep(60) AS {marker}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: running_query(module_strata, marker) or sleeper.poll() is not None,
            "PostgreSQL to run psql's query",
            timeout=60,
        )
        assert sleeper.poll() is None, sleeper.communicate()[1]
        sleeper.send_signal(signal.SIGINT)
        _, stderr = sleeper.communicate(timeout=30)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.communicate()
    assert "canceling statement due to user request" in stderr
    assert running_query(module_strata, marker) is None
    # psycopg's cancel (libpq's cancel connection; cancel_safe does not hold the GIL, which
    # the port's thread in this process needs), sent once PostgreSQL runs the query.
    marker = f"cancel_{uuid.uuid4().hex[:12]}"
    with (
        psycopg.connect(module_strata.psql_url, autocommit=True) as connection,
        ThreadPoolExecutor(1) as pool,
    ):

        def cancel_once_running() -> None:
            wait_until(
                lambda: running_query(module_strata, marker),
                "PostgreSQL to run psycopg's query",
                timeout=20,
            )
            connection.cancel_safe()

        canceller = pool.submit(cancel_once_running)
        started = time.monotonic()
        with pytest.raises(pg_errors.QueryCanceled):
            try:
                connection.execute(f"SELECT pg_sleep(30) AS {marker}")
            finally:
                canceller.result()  # its own failure first, if it had one
        assert time.monotonic() - started < 10
        assert connection.execute("SELECT 1").fetchone() == (1,)


def test_fifty_sessions_mix_selects_and_copies(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    raw, count = streams
    url = module_strata.psql_url

    def session(index: int) -> int:
        with psycopg.connect(url, autocommit=True) as connection:
            if index % 2:
                for _ in range(5):
                    connection.execute(f"SELECT count(*) FROM {count}").fetchone()
                return 0
            with connection.cursor().copy(
                f"COPY {raw} FROM STDIN WITH (RUN_ID 'c-{index}')"
            ) as copy:
                for user in range(10):
                    copy.write_row(("shoes", user, Decimal("1"), f"2026-11-21T10:{index:02d}:00Z"))
            return 10

    with ThreadPoolExecutor(50) as pool:
        loaded = sum(pool.map(session, range(50)))
    assert loaded == 250
    assert archived(module_strata, raw) == 250 and runs_of(module_strata, raw) == 25
    assert module_strata.query(f"SELECT sum(c) FROM {count}") == [(250,)]


# libpq's own calls, in a process of their own: libpq's blocking calls hold the GIL, which
# the port's thread in this test process needs.
LIBPQ_CLIENT = """
import json, sys
from psycopg import pq
url, raw, rows = sys.argv[1:]
out = {}
connection = pq.PGconn.connect(url.encode())
assert connection.status == pq.ConnStatus.OK, connection.error_message
connection.send_query_params(f"COPY {raw} FROM STDIN (FORMAT csv, HEADER)".encode(), None)
started = connection.get_result()
out["copy_in"] = [started.status == pq.ExecStatus.COPY_IN, started.nfields]
connection.put_copy_data(rows.encode())
connection.put_copy_end()
done = connection.get_result()
out["copy"] = [done.status == pq.ExecStatus.COMMAND_OK, done.command_status.decode()]
out["after"] = connection.get_result() is None
connection.prepare(b"shown", b"SHOW STREAMS")
described = connection.describe_prepared(b"shown")
out["show_columns"] = [described.fname(i).decode() for i in range(described.nfields)]
insert = f"INSERT INTO {raw} (t, user_id) VALUES ($1, $2)".encode()
connection.prepare(b"load", insert)
described = connection.describe_prepared(b"load")
types = [described.param_type(i) for i in range(described.nparams)]
out["insert_described"] = [described.nfields, types]
ran = connection.exec_prepared(b"load", [b"2026-11-21T10:05:00Z", b"9"])
out["insert"] = ran.command_status.decode()
again = connection.prepare(b"load", insert)
out["again"] = (again.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
connection.finish()
print(json.dumps(out))
"""


def test_libpq_extended_protocol_copy_and_describe(
    module_strata: Strata, streams: tuple[str, str]
) -> None:
    """COPY through Parse/Bind/Execute, and Describe of prepared statements (what JDBC and
    BI tools ask before they run anything), with libpq's own calls."""
    raw, _ = streams
    client = subprocess.run(
        [sys.executable, "-c", LIBPQ_CLIENT, module_strata.psql_url, raw, ROWS_CSV],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert client.returncode == 0, client.stderr
    out = json.loads(client.stdout)
    assert out["copy_in"] == [True, 4]
    assert out["copy"] == [True, "COPY 3"] and out["after"]
    assert out["show_columns"] == ["name", "kind", "parallelism", "raw_sources", "definition"]
    assert out["insert_described"] == [0, [1184, 20]]  # no rows; $1 timestamptz, $2 bigint
    assert out["insert"] == "INSERT 0 1"
    assert out["again"] == "42P05"  # the named statement exists already
    assert archived(module_strata, raw) == 4


def test_notifications_are_relayed_while_idle(module_strata: Strata) -> None:
    with (
        psycopg.connect(module_strata.psql_url, autocommit=True) as listener,
        psycopg.connect(module_strata.psql_url, autocommit=True) as sender,
    ):
        listener.execute("LISTEN strata_test")
        sender.execute("NOTIFY strata_test, 'hello'")
        received = next(listener.notifies(timeout=10))
        assert (received.channel, received.payload) == ("strata_test", "hello")


def test_a_join_stream_over_two_copies(module_strata: Strata, names: tuple[str, str]) -> None:
    """Both sides of a join loaded by COPY through the port; EXPLAIN STREAM shows the join."""
    suffix = names[0].split("_", 1)[1]
    left, right, joined = f"l_{suffix}", f"r_{suffix}", f"j_{suffix}"
    url = module_strata.psql_url
    for side, column in ((left, "v"), (right, "w")):
        psql(
            url,
            "-c",
            f"CREATE STREAM {side} (k integer, {column} integer, t timestamptz) "
            "WITH (event_time = 't')",
        )
    psql(
        url,
        "-c",
        f"CREATE STREAM {joined} AS SELECT l.k, l.v, r.w, l.t "
        f"FROM {left} l JOIN {right} r ON l.k = r.k",
    )
    psql(
        url,
        "-c",
        f"\\copy {left} FROM pstdin CSV",
        stdin="1,10,2026-11-21T10:00:00Z\n2,20,2026-11-21T10:00:00Z\n",
    )
    psql(url, "-c", f"\\copy {right} FROM pstdin CSV", stdin="1,100,2026-11-21T11:00:00Z\n")
    rows = psql(url, "-At", "-F", ",", "-c", f"SELECT k, v, w FROM {joined}").stdout.split()
    assert rows == ["1,10,100"]
    plan = psql(url, "-At", "-c", f"EXPLAIN STREAM {joined}").stdout
    assert f"Join input l: {left}" in plan and "Join archive:" in plan
