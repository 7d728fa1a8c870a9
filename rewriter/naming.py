"""Every derived object name in one place: schemas, archive tables and their indexes, state
and key columns.

Nothing else in Strata spells these names; change them here and everything follows.
PostgreSQL keeps only the first 63 bytes of an identifier, silently: a derived name longer
than that is shortened here instead, to a prefix and a hash of the whole name, so that
every name Strata creates is the name PostgreSQL stores and no two of them collide.
Renaming objects of existing databases takes a migration (see migrations/versions/0008).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from rewriter.errors import InvalidSQL

# Internal tables (archives) live here; users read the views in PUBLIC_SCHEMA.
INTERNAL_SCHEMA = "strata_internal"
PUBLIC_SCHEMA = "public"
CATALOG_SCHEMA = "strata_catalog"

# Column holding the run (or reduced set) a partial row or raw row came from.
RUN_COLUMN = "strata_run"
# A stream of rows that does not select its source's event time keeps it under this name,
# for the streams built on it, without showing it in its view.
HIDDEN_EVENT_TIME = "strata_event_time"
# The run number of partial rows the reducer folded together (runs start at 1).
REDUCED_RUN = 0
WINDOW_START_COLUMN = "window_start"
WINDOW_END_COLUMN = "window_end"

# Name of the temporary Spark view a run's rows are registered under.
RUN_ROWS_VIEW = "strata_run_rows"

# Longest stream name; a derived name that does not fit in MAX_IDENTIFIER is shortened.
MAX_STREAM_NAME = 50
# PostgreSQL's identifiers: NAMEDATALEN - 1 bytes; it cuts longer ones to this many.
MAX_IDENTIFIER = 63
_HASH_CHARS = 8
_STREAM_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_RESERVED_PREFIX = "strata_"
_SYSTEM_PREFIX = "pg_"


def check_stream_name(name: str) -> str:
    """Return ``name`` if it is a valid stream name, else raise InvalidSQL saying why."""
    if not _STREAM_NAME.match(name) or len(name) > MAX_STREAM_NAME:
        raise InvalidSQL(
            f"invalid stream name {name!r}: use lower-case letters, digits and underscores, "
            f"starting with a letter or underscore, at most {MAX_STREAM_NAME} characters"
        )
    if name.startswith(_RESERVED_PREFIX):
        raise InvalidSQL(
            f"invalid stream name {name!r}: the prefix {_RESERVED_PREFIX!r} is reserved"
        )
    if name.startswith(_SYSTEM_PREFIX):
        # PostgreSQL looks in pg_catalog first: a view public.pg_class would be hidden.
        raise InvalidSQL(
            f"invalid stream name {name!r}: the prefix {_SYSTEM_PREFIX!r} is PostgreSQL's "
            "(its system catalogs would hide the stream's view)"
        )
    return name


def check_column_name(name: str, *, window_names: bool = False) -> str:
    """Return ``name`` if a stream may have a column so named, else raise InvalidSQL saying
    why. ``window_names``: window_start and window_end are allowed (a join passes an input's
    window columns through)."""
    if not _STREAM_NAME.match(name) or len(name) > MAX_IDENTIFIER:
        raise InvalidSQL(
            f"invalid column name {name!r}: use lower-case letters, digits and underscores, "
            "starting with a letter or underscore, at most 63 characters"
        )
    reserved = {RUN_COLUMN, WINDOW_START_COLUMN, WINDOW_END_COLUMN, SERIAL_WINDOW_COLUMN}
    if window_names:
        reserved -= {WINDOW_START_COLUMN, WINDOW_END_COLUMN}
    if name in reserved:
        raise InvalidSQL(f"invalid column name {name!r}: it is reserved by Strata")
    return name


def fit(name: str) -> str:
    """``name`` if PostgreSQL keeps it whole, else its first bytes and the first 8 hex digits
    of its SHA-256, 63 bytes in all: the same name every time, and names that PostgreSQL
    would cut to the same 63 bytes stay apart."""
    encoded = name.encode()
    if len(encoded) <= MAX_IDENTIFIER:
        return name
    digest = hashlib.sha256(encoded).hexdigest()[:_HASH_CHARS]
    prefix = encoded[: MAX_IDENTIFIER - _HASH_CHARS - 1].decode(errors="ignore")
    return f"{prefix}_{digest}"


def raw_archive_table(stream: str) -> str:
    return fit(f"{stream}__raw")


def raw_runs_index(stream: str) -> str:
    """BRIN index of a raw archive on the run column (back-fill reads history by run)."""
    return fit(f"{stream}__raw_runs")


def session_index(raw_stream: str, columns: Iterable[str]) -> str:
    """Index of a raw archive on a session stream's keys and event time, which its sessions
    are formed by (kept when the session stream is dropped: another may use it, and it goes
    with the raw stream)."""
    return fit(f"{raw_stream}__raw_{'_'.join(columns)}_sessions")


def partial_archive_table(stream: str) -> str:
    return fit(f"{stream}__partial")


def partial_window_index(stream: str) -> str:
    """Index of a partial archive on its window and group keys."""
    return fit(f"{stream}__partial_window")


def consolidated_table(stream: str) -> str:
    """A stream's reduced windows: one row per window and group with its final values, as
    narrow as the view's rows (what a dashboard reads)."""
    return fit(f"{stream}__reduced")


def consolidated_states_table(stream: str) -> str:
    """The partial form of a stream's reduced windows (states, one row per window and group),
    which late data of those windows merges with on read."""
    return fit(f"{stream}__reduced_states")


def consolidated_index(stream: str, purpose: str) -> str:
    """Index of a consolidated table: on its window and group keys ("window"), on its
    window end ("end"), where time filters meet it, or on its keys and window end
    ("key_end"), where a filter on a key meets it."""
    return fit(f"{stream}__reduced_{purpose}")


def final_column(aggregate_index: int) -> str:
    """The final value of an aggregate, as the consolidated table keeps it."""
    return f"final_{aggregate_index}"


def partial_view(stream: str) -> str:
    """Spark temporary view of a stream's partial rows in a batch (input of its roll-ups)."""
    return f"strata_partials_{stream}"


def projection_view(stream: str) -> str:
    """Spark temporary view of a projection stream's rows in a batch."""
    return f"strata_rows_{stream}"


def key_column(index: int) -> str:
    return f"key_{index}"


def state_column(aggregate_index: int, state: str) -> str:
    return f"agg_{aggregate_index}_{state}"


def joined_table(stream: str) -> str:
    """An aggregate stream joined with tables on read: its view's rows of the reduced
    windows, joined with the tables as they were when the reducer wrote them."""
    return fit(f"{stream}__joined")


def joined_index(stream: str, purpose: str) -> str:
    """Index of a joined table: on its rows' window start ("window"), on a column showing
    the window ("by_<column>")."""
    return fit(f"{stream}__joined_{purpose}")


def joined_seen_table(stream: str) -> str:
    """The sum of the joined tables' versions (strata_catalog.table_versions) a joined
    table's rows were written at: one row, none until they are first written."""
    return fit(f"{stream}__joined_seen")


def joined_current_function(stream: str) -> str:
    """Function (in INTERNAL_SCHEMA) saying whether a stream's joined rows are current."""
    return _function_name("strata_joined", stream)


def serial_archive_table(stream: str) -> str:
    """Archive of a serial stream: its rows for the windows already materialized."""
    return fit(f"{stream}__serial")


def serial_window_index(stream: str) -> str:
    """Index of a serial archive on its window column."""
    return fit(f"{stream}__serial_window")


def serial_time_index(stream: str, column: str) -> str:
    """Index of a serial archive on a column that shows its window (a top-N stream's
    window end), which readers filter by."""
    return fit(f"{stream}__serial_by_{column}")


def serial_live_function(stream: str) -> str:
    """Function (in INTERNAL_SCHEMA) computing a serial stream's windows on read that are
    not materialized yet."""
    return _function_name("strata_live", stream)


def serial_awaiting_function(stream: str) -> str:
    """Function (in INTERNAL_SCHEMA) computing a serial stream's windows awaiting repair on
    read."""
    return _function_name("strata_awaiting", stream)


def waiting_windows_function(stream: str) -> str:
    """Function (in INTERNAL_SCHEMA) listing the windows of an aggregate stream whose
    partial rows wait for the reducer (its view merges them on read)."""
    return _function_name("strata_waiting", stream)


# The windows of every aggregate stream whose partial rows wait for the reducer, one row
# per (partial archive, window start), with a generation each commit listing the window
# again raises: the archive's trigger (WAITING_TRIGGER, calling MARK_WAITING_FUNCTION, both
# in INTERNAL_SCHEMA) lists a window in the statement that adds its partial rows, and the
# reducer's fold unlists it at the generation it read (rewriter.build_views).
WAITING_WINDOWS_TABLE = "waiting_windows"
WAITING_ARCHIVE_COLUMN = "archive"
WAITING_GENERATION_COLUMN = "generation"
WAITING_TRIGGER = "strata_list_waiting"
MARK_WAITING_FUNCTION = "strata_list_waiting_windows"


def _function_name(prefix: str, stream: str) -> str:
    """``prefix`` and ``stream`` in lower case letters, digits and underscores only, so that
    the name needs no quotes (sqlglot writes a function's name in upper case, which
    PostgreSQL folds back), and the first 8 hex digits of the stream's SHA-256, which keep
    names that differ in case or punctuation apart."""
    slug = re.sub(r"[^a-z0-9_]", "_", stream.lower())
    digest = hashlib.sha256(stream.encode()).hexdigest()[:8]
    return fit(f"{prefix}_{slug}_{digest}")


# Columns of an aggregate stream's view under its outputs (the UNION ALL of consolidated
# rows read as they are and rows merged on read): each row's window start, and whether it
# is a consolidated row read as it is (rewriter/build_views.py view_query). A '$' keeps them
# apart from every column name a stream may have (check_column_name), so they are quoted.
VIEW_WINDOW_COLUMN = "strata$window_start"
VIEW_STORED_COLUMN = "strata$stored"

# Column of a serial archive holding the start of the window a row belongs to.
SERIAL_WINDOW_COLUMN = "strata_window"
# Transaction-local settings passing the windows to the serial statements (their SQL embeds
# the user's expressions, which may hold a literal '%', so they take no placeholders).
SERIAL_WINDOWS_SETTING = "strata.serial_windows"  # timestamptz[]: the windows to (re)compute
SERIAL_FROM_SETTING = "strata.serial_from"  # timestamptz: first window start to list
SERIAL_TO_SETTING = "strata.serial_to"  # timestamptz: list windows starting before this
SERIAL_LIMIT_SETTING = "strata.serial_limit"  # integer: list at most this many windows


# ---- join streams ------------------------------------------------------------------------


def join_archive_table(stream: str) -> str:
    """Archive of a join stream: its rows, each with the run whose commit produced it."""
    return fit(f"{stream}__join")


def join_archive_index(stream: str, purpose: str) -> str:
    return fit(f"{stream}__join_{purpose}")


def probe_index(raw_stream: str, column: str) -> str:
    """Index of a raw archive on a column that joins look rows up by."""
    return fit(f"{raw_stream}__raw_{column}_probe")


def join_column(alias: str, column: str) -> str:
    """An input's column inside a join's queries: the alias keeps inputs apart."""
    return f"{alias}__{column}"


def join_input_view(position: int) -> str:
    """Spark temporary view of the rows of a join's input (by position) in a batch."""
    return f"strata_join_input_{position}"


def join_input_alias(position: int) -> str:
    """Alias of a join's input (by position) in its Spark and PostgreSQL queries."""
    return f"strata_input_{position}"


def join_rows_stream(stream: str) -> str:
    """The join stream that an aggregate over a join in one statement is built on."""
    return f"{stream}__rows"


def inner_stream(stream: str) -> str:
    """The stream a query over a subquery in FROM reads: the subquery, planned as a stream."""
    return f"{stream}__inner"


def join_input_stream(stream: str, position: int) -> str:
    """The stream a subquery joined in FROM becomes (``position``: its place among the
    FROM items, from 1)."""
    return f"{stream}__in{position}"


def with_stream(stream: str, position: int) -> str:
    """The stream a common table expression read by a window call becomes (``position``:
    its place among those, from 1)."""
    return f"{stream}__with{position}"


def union_stream(stream: str, position: int) -> str:
    """The stream a branch of a UNION ALL that aggregates becomes (a grouping set of GROUP
    BY ROLLUP, CUBE or GROUPING SETS is one such branch; ``position``: its place, from 1)."""
    return f"{stream}__union{position}"


SEMI_JOIN_VALUE = "strata_in_value"  # the one column of an IN subquery's distinct values


SCALAR_VALUE = "strata_scalar_value"  # the one column of a one-row scalar subquery


def scalar_key(position: int) -> str:
    """The ``position``-th column (from 1) of a correlated scalar subquery's join input: the
    subquery's side of its ``position``-th correlating equality."""
    return f"strata_scalar_key_{position}"


def scalar_alias(position: int) -> str:
    """Alias of the ``position``-th one-row scalar subquery (from 1), the join input it
    becomes (rewriter.scalar_subqueries)."""
    return f"strata_scalar_{position}"


# NOT IN's counts of its subquery: rows, and values that are not NULL.
NOT_IN_ROWS = "strata_in_rows"
NOT_IN_VALUES = "strata_in_values"


def not_in_counts_alias(position: int) -> str:
    """Alias of the counts of a WHERE's ``position``-th NOT IN subquery (from 1)."""
    return f"strata_in_{position}_counts"


def semi_join_value(position: int) -> str:
    """The ``position``-th column (from 1) of a semi-join's distinct keys: an IN subquery
    has one, an EXISTS one per equality correlating it."""
    return SEMI_JOIN_VALUE if position == 1 else f"{SEMI_JOIN_VALUE}_{position}"


def semi_join_alias(position: int) -> str:
    """Alias of the distinct values of a WHERE's ``position``-th IN subquery (from 1), the
    join input it becomes (rewriter.semi_joins)."""
    return f"strata_in_{position}"


_MADE_WITH = re.compile(r"__(?:rows|inner|in[0-9]+|with[0-9]+|union[0-9]+)")


def made_with(stream: str, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that are streams made with ``stream`` from its statement (its join
    ``__rows``, its subquery ``__inner``, its subqueries joined ``__in<k>``, the common
    table expressions its window calls read ``__with<k>``, the branches of its union
    ``__union<k>``), in the order of ``names``."""
    return [
        n
        for n in names
        if n.startswith(f"{stream}__") and _MADE_WITH.fullmatch(n[len(stream) :]) is not None
    ]


ALTERING_SUFFIX = "__next"
# Longest name of a stream that ALTER STREAM can change: its new definition is built beside
# it under a longer name (altering_stream), which must be a stream name itself.
MAX_ALTERED_NAME = MAX_STREAM_NAME - len(ALTERING_SUFFIX)


def altering_stream(stream: str) -> str:
    """The stream an ALTER STREAM builds the new definition of ``stream`` as, until the
    swap gives it ``stream``'s name (server/alter.py)."""
    return f"{stream}{ALTERING_SUFFIX}"


def join_view(stream: str) -> str:
    """Spark temporary view of the rows a batch adds to a join stream (input of the
    streams built on it)."""
    return f"strata_joined_{stream}"


# ---- the change feed ---------------------------------------------------------------------

# The statement trigger on a PostgreSQL table a followed stream joins (one per table,
# whichever streams join it), and the function it runs (sql/005_feed.sql).
FEED_TABLE_TRIGGER = "strata_feed_table_changed"
TABLE_CHANGED_FUNCTION = "strata_table_changed"
