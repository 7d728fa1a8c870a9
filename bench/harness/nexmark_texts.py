"""The Nexmark project's own query texts (bench/nexmark_queries/, copied from nexmark/nexmark
with its license) as Strata takes them: which run as written.

Each file is Flink SQL: the sink (``CREATE TABLE nexmark_qN (...) WITH ('connector' =
'blackhole')``) and ``INSERT INTO nexmark_qN <query>``, sometimes a view (``CREATE VIEW``),
a side input (``CREATE TABLE side_input``) or a user function (``CREATE FUNCTION``) before. A
Strata stream is the sink and the INSERT at once, so each file is read, mechanically, as:

* the sink's ``CREATE TABLE nexmark_qN (...) WITH (...)`` (a blackhole, or q10's files):
  its column names (the stream is the sink: ``CREATE STREAM nexmark_qN`` keeps its name);
* ``INSERT INTO nexmark_qN <query>``: ``CREATE STREAM nexmark_qN (<the sink's column
  names>) AS <query>``, the query as written (INSERT INTO fills the sink's columns in
  order, and a column list names the stream's so); without the list where the query
  selects ``*`` (its names are then its inputs', as the sink's are);
* ``CREATE VIEW v AS <query>``: ``CREATE STREAM v AS <query>`` (a view of a stream is a
  stream);
* any other ``CREATE TABLE``: a source, a PostgreSQL table (q13's side input, whose DDL is
  adapted in its file);
* ``CREATE FUNCTION name(...) ... RETURN <expression>``: a PostgreSQL SQL function (q14's,
  adapted in its file from the Java class Nexmark names), created before the streams,
  which inline it; Flink's ``CREATE FUNCTION name AS 'class'`` (a Java class, which Strata
  cannot load) refuses the query, with Strata's message.

Nothing else of the text changes: the query runs as written or is refused, with Strata's
message. The sources are bench/nexmark_queries/ddl_strata.sql (the adapted source DDL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from bench.harness.nexmark_queries import QUERIES as TWIN_QUERIES
from rewriter.errors import StrataError
from rewriter.flink_syntax import flink_function
from rewriter.rewrite import planned_with_companions
from rewriter.sql_functions import SqlFunction
from rewriter.tables import TableColumn, TableSchema

TEXTS = Path(__file__).resolve().parents[1] / "nexmark_queries"
# nexmark/nexmark's commit the texts were copied from (nexmark-flink/src/main/resources/queries/).
SOURCE_COMMIT = "6b3646c3baec701f1fa74baf938d235f742e5d3c"
QUERIES = tuple(f"q{n}" for n in range(24))
SINK = re.compile(r"CREATE\s+TABLE\s+(nexmark_q\d+)\b", re.I)
INSERT = re.compile(r"INSERT\s+INTO\s+(\w+)\s+", re.I)
VIEW = re.compile(r"CREATE\s+VIEW\s+(\w+)\s+AS\s+", re.I)
TABLE = re.compile(r"CREATE\s+TABLE\s+(\w+)\s*\((.*)\)\s*$", re.I | re.S)
STAR = re.compile(r"\s*SELECT\s+\*", re.I)
FUNCTION = re.compile(r"CREATE\s+(?:TEMPORARY\s+)?FUNCTION\s+(\w+)", re.I)
# A SQL function as q14 writes it: CREATE FUNCTION name(arg type, ...) RETURNS type
# LANGUAGE sql <volatility> RETURN <expression>.
SQL_FUNCTION = re.compile(
    r"CREATE\s+FUNCTION\s+(\w+)\s*\((.*?)\)\s+RETURNS\s+(\w+)\s+LANGUAGE\s+(\w+)\s+"
    r"(IMMUTABLE|STABLE|VOLATILE)\s+(RETURN\s.*)$",
    re.I | re.S,
)
SIDE_INPUT_KEYS = 10_000
TWINS = {q.name: q for q in TWIN_QUERIES}


# Nexmark's column names, as Strata folds them (ddl_strata.sql), for the harness's.
FLINK_NAMES = {
    "date_time": "datetime",
    "item_name": "itemname",
    "initial_bid": "initialbid",
    "email_address": "emailaddress",
    "credit_card": "creditcard",
}
_Q7 = (
    "SELECT b.auction, b.price, b.bidder, b.datetime, b.extra FROM bid b JOIN (SELECT "
    "max(price) AS maxprice, date_bin('10 seconds', datetime, timestamptz 'epoch') + "
    "INTERVAL '10 seconds' AS datetime FROM bid GROUP BY 2) b1 ON b.price = b1.maxprice "
    "WHERE b.datetime BETWEEN b1.datetime - INTERVAL '10 seconds' AND b1.datetime"
)
_Q9_COLUMNS = (
    "id, itemname, description, initialbid, reserve, datetime, expires, seller, category, "
    "extra, auction, bidder, price, bid_datetime, bid_extra"
)
# (the view's rows, the batch query's) where the text's columns differ from its twin's
# in bench/harness/nexmark_queries.py; every other text is compared whole with its twin
# (q6's twin breaks ties in price by time, where the text leaves them to chance: the same
# rows unless an auction's two highest bids tie, which a check then reports).
COMPARED = {
    "q5": ("SELECT * FROM nexmark_q5", "SELECT auction, num FROM ({q5}) t"),
    "q7": ("SELECT * FROM nexmark_q7", _Q7),
    "q9": (
        "SELECT * FROM nexmark_q9",
        f"SELECT {_Q9_COLUMNS.replace('bid_datetime', 'bid_date_time')} FROM ({{q9}}) t",
    ),
    # CountChar, and so q14's count_char, counts 0 in a NULL string (the twin's NULL).
    "q14": (
        "SELECT * FROM nexmark_q14",
        "SELECT auction, bidder, price, bid_time_type, date_time, extra, coalesce(c_counts, 0) "
        "FROM ({q14}) t",
    ),
    # ROW_NUMBER() ordered by price alone: which of bids tied in price are kept is not
    # determined, their prices are.
    "q19": ("SELECT auction, price FROM nexmark_q19", "SELECT auction, price FROM ({q19}) t"),
}


def flink_names(sql: str) -> str:
    """``sql`` of the harness's twins (bench/harness/nexmark_queries.py) with Nexmark's column
    names, as the texts' sources (ddl_strata.sql) spell them."""
    for snake, flink in FLINK_NAMES.items():
        sql = re.sub(rf"\b{snake}\b", flink, sql)
    return sql


def compared(query: str) -> tuple[str, str]:
    """What a text's result is checked against: (its view's rows, the batch query over the
    texts' sources giving the same rows), from its twin in bench/harness/nexmark_queries.py."""
    twin = flink_names(TWINS[query].batch)
    view, batch = COMPARED.get(query, (f"SELECT * FROM nexmark_{query}", "{twin}"))
    return view, flink_names(batch.replace("{twin}", twin).replace(f"{{{query}}}", twin))


def flink_header(body: bytes) -> bytes:
    """A run's CSV body (the workload's column names) for the texts' sources."""
    header, rest = body.split(b"\n", 1)
    return flink_names(header.decode()).encode() + b"\n" + rest


@dataclass(frozen=True)
class Text:
    """One query file, read as Strata statements."""

    query: str  # q0 .. q23
    stream: str  # the stream whose view is the result (the sink's name)
    streams: tuple[str, ...]  # CREATE STREAM statements, in order; the last is ``stream``
    tables: tuple[str, ...]  # PostgreSQL statements: the sources that are tables
    refused: str | None  # why Strata cannot take the file at all, if it cannot
    functions: tuple[str, ...] = ()  # PostgreSQL statements: the SQL functions it calls


def statements(text: str) -> list[str]:
    """The statements of ``text``, split at semicolons outside quotes and comments, with
    the comments removed where they stand alone on a line (kept inside a statement)."""
    found, current, k = [], [], 0
    quote: str | None = None
    while k < len(text):
        char = text[k]
        if quote is not None:
            current.append(char)
            if char == quote:
                quote = None
        elif char in "'`\"":
            quote = char
            current.append(char)
        elif text.startswith("--", k):
            end = text.find("\n", k)
            end = len(text) if end < 0 else end
            current.append(text[k:end])
            k = end
            continue
        elif char == ";":
            found.append("".join(current))
            current = []
        else:
            current.append(char)
        k += 1
    found.append("".join(current))
    return [s for s in (_strip_comments(s) for s in found) if s]


def _strip_comments(statement: str) -> str:
    """``statement`` without the comment lines before it."""
    lines = statement.strip().splitlines()
    while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
        lines.pop(0)
    return "\n".join(lines).strip()


def read(query: str) -> Text:
    text = (TEXTS / f"{query}.sql").read_text()
    sink = f"nexmark_{query}"
    streams: list[str] = []
    tables: list[str] = []
    functions: list[str] = []
    refused = None
    columns: list[str] = []
    for statement in statements(text):
        if (found := SINK.match(statement)) is not None:
            sink = found.group(1)
            columns = _sink_columns(statement)
        elif (insert := INSERT.match(statement)) is not None:
            query = statement[insert.end() :]
            named = "" if STAR.match(query) else f" ({', '.join(columns)})"
            streams.append(f"CREATE STREAM {insert.group(1)}{named} AS {query}")
        elif (view := VIEW.match(statement)) is not None:
            streams.append(f"CREATE STREAM {view.group(1)} AS {statement[view.end() :]}")
        elif FUNCTION.match(statement) is not None:
            if (java := flink_function(statement)) is not None:
                refused = str(java)
            else:
                functions.append(statement)
        elif TABLE.match(statement):
            tables.append(statement.replace("`", '"'))
        else:
            raise ValueError(f"{query}: a statement the harness does not read: {statement[:60]}")
    return Text(query, sink, tuple(streams), tuple(tables), refused, tuple(functions))


def _sink_columns(statement: str) -> list[str]:
    """The names of the sink's columns, as Strata spells them (lower case)."""
    start = statement.index("(") + 1
    depth, end = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(statement[end], 0)
        end += 1
    body = statement[start : end - 1]
    return [part.split()[0].strip("`").lower() for part in re.split(r",(?![^(]*\))", body)]


def source_statements() -> list[str]:
    """The CREATE STREAM of person, auction and bid (ddl_strata.sql)."""
    return statements((TEXTS / "ddl_strata.sql").read_text())


def side_input_rows() -> str:
    """q13's side input: key 0-9999, each with one version valid since the epoch."""
    return (
        "INSERT INTO side_input SELECT k, 'value-' || k, timestamptz 'epoch' "
        f"FROM generate_series(0, {SIDE_INPUT_KEYS - 1}) k"
    )


def _schema(statement: str) -> TableSchema:
    """What the rewriter knows of a table the harness creates (name, columns, key)."""
    match = TABLE.match(statement)
    assert match is not None
    name, body = match.group(1).lower(), match.group(2)
    columns: list[TableColumn] = []
    key: tuple[str, ...] = ()
    for part in re.split(r",(?![^(]*\))", body):
        words = part.split()
        if words[0].upper() == "PRIMARY":
            listed = re.findall(r"\((.*)\)", part)[0].split(",")
            key = tuple(k.strip().strip('"').lower() for k in listed)
            continue
        kind = {"BIGINT": "bigint", "VARCHAR": "text"}.get(words[1].upper(), words[1].lower())
        if kind == "timestamptz":
            kind = "timestamp with time zone"
        columns.append(TableColumn(words[0].strip('"').lower(), kind))
    return TableSchema(name, tuple(columns), key)


def _function(statement: str) -> SqlFunction:
    """What the server reads of a SQL function from pg_proc, read from its CREATE FUNCTION."""
    match = SQL_FUNCTION.match(statement)
    if match is None:
        raise ValueError(f"a CREATE FUNCTION the harness does not read: {statement[:60]}")
    name, arguments, result, language, volatility, body = match.groups()
    return SqlFunction(
        name=name.lower(),
        arguments=tuple(
            (a.split()[0].lower(), a.split()[1].lower()) for a in arguments.split(",") if a
        ),
        result=result.lower(),
        language=language.lower(),
        volatility=volatility.lower(),
        returns_set=False,
        body=body,
    )


def plan(text: Text) -> str | None:
    """Plan the query's streams as the server would (companions first), without a server:
    None when every statement plans, else Strata's message."""
    if text.refused is not None:
        return text.refused
    sources = planned_with_companions(source_statements(), {})
    tables = {s.name: s for s in (_schema(t) for t in text.tables)}
    functions = {f.name: f for f in map(_function, text.functions)}
    try:
        planned_with_companions(text.streams, sources, tables, functions)
    except StrataError as error:
        return str(error)
    return None


def report() -> dict[str, str | None]:
    """Per query: None when its text plans as written, else why not."""
    return {query: plan(read(query)) for query in QUERIES}


if __name__ == "__main__":
    for query, problem in report().items():
        print(f"{query}: {'runs as written' if problem is None else problem}")
