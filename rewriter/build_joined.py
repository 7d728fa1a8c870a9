"""Pass 3e, continued: the rows an aggregate over a stream-table join keeps joined.

Such a stream's partials are kept per window and the stream's join columns, and joined
with the tables on read (rewriter/build_lookup.py), so that every result follows the
tables' current content. Joining on read costs every read the join and a second
aggregation over all of those partial rows: for a dashboard's 6 hours of 1,000 campaigns
joined to their 20 owners, 360,000 partial rows for 7,200 result rows, 56 times a plain
table's read. So the view's rows of the reduced windows are kept joined as well, in the
stream's joined table (naming.joined_table), and read like a plain table while they are
current:

- the reducer's fold writes the joined rows of the windows it rewrites, in its own
  statement (``fold_steps``), so they change with the windows' states, in one snapshot;
- they are written with the sum of the joined tables' versions (the statement trigger of
  sql/005_feed.sql counts every change of a table in its transaction), in the joined seen
  table; a change of a table moves the sum, and from the changing transaction's commit on
  the view joins every window on read, until the reducer's next pass writes all the rows
  anew (``refresh_statement``, one statement) with the new sum;
- windows that late data waits in are merged and joined on read, as the other windows of
  an aggregate view are (rewriter/build_views.py).

So the view is three branches, each behind a check PostgreSQL makes once per read (the
stream's check function, naming.joined_current_function): the joined rows of the windows
nothing waits in, when they are current; every window joined on read, when they are not;
the windows late data waits in joined on read, when they are. A branch whose check fails
is not run, and starts no parallel workers: the check is PARALLEL RESTRICTED, so it is
made above them (rewriter.ddl.create_check_function). Each read sees one snapshot, in
which the joined rows, the states, the tables and their versions agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.build_views import (
    folded_rows,
    in_waiting_window,
    partial_rows,
    reduced_rows,
    waiting_rows,
)
from rewriter.ddl import (
    check_call,
    column_def,
    create_check_function,
    create_index,
    create_table,
    drop,
    table,
)
from rewriter.plan import JoinedRows
from rewriter.resolve_window import WindowSpec
from rewriter.split_query import SplitQuery

# The view's query over the stream's partial rows given (a subquery, aliased by the caller).
OverRows = Callable[[exp.Expr], exp.Select]

_KEPT = naming.VIEW_WINDOW_COLUMN  # the joined rows' window start, under the outputs
_SEEN = "seen"


@dataclass(frozen=True)
class Joined:
    """What the plan of an aggregate joined with tables on read gains by keeping its rows."""

    create_statements: tuple[str, ...]  # the joined table, its indexes, the seen table
    drop_statements: tuple[str, ...]
    view: exp.Query
    fold_steps: tuple[tuple[str, exp.Expr], ...]  # reduce_statement's ``also``
    rows: JoinedRows


def build_joined(
    name: str,
    split: SplitQuery,
    window: WindowSpec,
    over: OverRows,
    outputs: Sequence[str],
    time_outputs: Sequence[str],
    tables: Sequence[str],
) -> Joined:
    """``over``: the view's query (grouped by the stream's window start, which it reads as
    ``start``) over the given partial rows; ``outputs``: its columns; ``time_outputs``:
    those showing the window (indexed, as a dashboard's table would be); ``tables``: the
    joined tables as the statement names them (schema-qualified or not, quoted as SQL)."""
    joined = table(naming.joined_table(name))
    seen = table(naming.joined_seen_table(name))
    function = naming.joined_current_function(name)
    current = check_call(function)
    columns = [exp.to_identifier(c, quoted=True) for c in (*outputs, _KEPT)]

    def kept(rows: exp.Expr) -> exp.Select:
        """The joined rows of the windows of ``rows``, with their window start."""
        query = over(rows)
        start = query.args["group"].expressions[0].copy()
        return query.select(exp.alias_(start, _KEPT, quoted=True))

    create_joined = exp.Create(
        this=joined.copy(),
        kind="TABLE",
        expression=kept(reduced_rows(name, split)),
        properties=exp.Properties(expressions=[exp.WithDataProperty(no=True)]),
    ).sql("postgres")
    indexes = [
        create_index(naming.joined_index(name, purpose), joined, [exp.column(column, quoted=True)])
        for purpose, column in (("window", _KEPT), *((f"by_{c}", c) for c in time_outputs))
    ]
    create_seen = create_table(seen, [column_def(_SEEN, "bigint")])

    stored = (
        exp.select(*(exp.column(c, table="j", quoted=True) for c in outputs))
        .from_(exp.alias_(joined.copy(), "j", table=True))
        .where(
            exp.and_(
                current.copy(),
                exp.Not(
                    this=exp.paren(
                        in_waiting_window(name, window, exp.column(_KEPT, table="j", quoted=True))
                    )
                ),
            )
        )
    )
    every_window = over(partial_rows(name, split, window)).where(exp.Not(this=current.copy()))
    waiting = over(waiting_rows(name, split, window)).where(current.copy())
    view = exp.union(exp.union(stored, every_window, distinct=False), waiting, distinct=False)

    changed = (
        exp.select(exp.column(naming.WINDOW_START_COLUMN))
        .distinct()
        .from_("placed")
        .subquery("changed")
    )
    fold_steps: tuple[tuple[str, exp.Expr], ...] = (
        (
            "unjoined",
            exp.Delete(
                this=exp.alias_(joined.copy(), "j", table=True),
                using=[changed],
                where=exp.Where(
                    this=exp.EQ(
                        this=exp.column(_KEPT, table="j", quoted=True),
                        expression=exp.column(naming.WINDOW_START_COLUMN, table="changed"),
                    )
                ),
            ),
        ),
        (
            "joined",
            exp.insert(
                kept(folded_rows(split)).where(current.copy()), joined.copy(), columns=columns
            ),
        ),
    )

    versions = exp.select(exp.alias_(_versions(tables), _SEEN)).subquery("versions")
    refresh = exp.insert(
        exp.select(exp.column(_SEEN)).from_(versions),
        seen.copy(),
        columns=[exp.to_identifier(_SEEN)],
    )
    for alias, step in (
        ("cleared", exp.Delete(this=joined.copy())),
        ("written", exp.insert(kept(reduced_rows(name, split)), joined.copy(), columns=columns)),
        ("forgotten", exp.Delete(this=seen.copy())),
    ):
        refresh = refresh.with_(alias, as_=step)
    return Joined(
        create_statements=(
            create_joined,
            *indexes,
            create_seen,
            create_check_function(function, exp.select(_current(seen, tables))),
        ),
        drop_statements=(
            drop("FUNCTION", table(function)),
            drop("TABLE", joined),
            drop("TABLE", seen),
        ),
        view=view,
        fold_steps=fold_steps,
        rows=JoinedRows(
            current_query=exp.select(current).sql("postgres"),
            refresh_statement=refresh.sql("postgres"),
        ),
    )


def _versions(tables: Sequence[str]) -> exp.Expr:
    """The sum of ``tables``' versions now (0 before any is counted)."""
    regclass = exp.DataType.build("regclass", dialect="postgres")
    total = exp.cast(
        exp.func("COALESCE", exp.Sum(this=exp.column("version", table="v")), exp.Literal.number(0)),
        "bigint",
    )
    versions = exp.table_("table_versions", db=naming.CATALOG_SCHEMA, quoted=True)
    return (
        exp.select(total)
        .from_(exp.alias_(versions, "v", table=True))
        .where(
            exp.In(
                this=exp.column("relation", table="v"),
                expressions=[exp.cast(exp.Literal.string(t), regclass) for t in tables],
            )
        )
        .subquery()
    )


def _current(seen: exp.Table, tables: Sequence[str]) -> exp.Expr:
    """Whether the joined rows were written at the tables' versions now (false before they
    were first written), and the trigger counting the tables' changes is on each of them,
    enabled (a trigger dropped or disabled would leave changes uncounted): the body of the
    stream's check function, which a read calls once, before the branches."""
    written = (
        exp.select(exp.Max(this=exp.column(_SEEN, table="s")))
        .from_(exp.alias_(seen.copy(), "s", table=True))
        .subquery()
    )
    distinct = list(dict.fromkeys(tables))
    regclass = exp.DataType.build("regclass", dialect="postgres")
    triggers = (
        exp.select(exp.Count(this=exp.Star()))
        .from_(exp.alias_(exp.table_("pg_trigger", db="pg_catalog"), "t", table=True))
        .where(
            exp.and_(
                exp.In(
                    this=exp.column("tgrelid", table="t"),
                    expressions=[exp.cast(exp.Literal.string(t), regclass) for t in distinct],
                ),
                exp.EQ(
                    this=exp.column("tgname", table="t"),
                    expression=exp.Literal.string(naming.FEED_TABLE_TRIGGER),
                ),
                exp.In(
                    this=exp.column("tgenabled", table="t"),
                    expressions=[exp.Literal.string("O"), exp.Literal.string("A")],
                ),
            )
        )
        .subquery()
    )
    return exp.paren(
        exp.and_(
            exp.func("COALESCE", exp.EQ(this=written, expression=_versions(tables)), exp.false()),
            exp.EQ(this=triggers, expression=exp.Literal.number(len(distinct))),
        )
    )
