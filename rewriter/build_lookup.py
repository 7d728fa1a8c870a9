"""Pass 3e: a stream joined with PostgreSQL tables the user owns (stream-table joins).

A table changes under the stream, and every result must follow its *current* content, so
the tables are joined on read, never when a run is computed:

- Without aggregates, the stream is a view over the stream's own view and the tables
  (ReadJoinStreamPlan): nothing is computed per run.
- With aggregates over a window of the stream, the aggregates are pushed below the join.
  Spark keeps partials per run, window and *join columns* (the stream columns the join
  conditions, the filters on table columns and the groups read); the view joins those
  partial rows with the tables on read and merges them per the query's own groups. A
  partial row stands for all of its stream rows, which share its join columns and so join
  the same table rows: merging it once per matching table row is the batch join's
  multiplicity, because every partial state merges as a bag (sums and counts add, min, max
  and distinct sets are idempotent, sketches add their counts).

``JOIN t FOR SYSTEM_TIME AS OF x.time AS v``: the version of ``t`` valid at ``x.time``, read
from a table whose primary key is the version key plus one validity column (timestamptz,
timestamp or date): per stream row, the row with the same key and the greatest validity
not after the time. Versions that arrive late are found by the next read, as the join is
made on read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.build_joined import build_joined
from rewriter.build_views import build_views, partial_rows, reduce_statement
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import check_clauses, output_name
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.expressions import conjuncts, infer_type
from rewriter.plan import (
    JoinStreamPlan,
    OutputColumn,
    ParallelAggregatePlan,
    ProjectionStreamPlan,
    RawStreamPlan,
    ReadJoinStreamPlan,
    StreamPlan,
)
from rewriter.registry import contains_aggregate, is_aggregate
from rewriter.resolve_window import WindowSpec, fixed_interval, resolve_window
from rewriter.split_aggregates import split_aggregates
from rewriter.split_query import SplitAggregate, SplitQuery, group_by_keys
from rewriter.tables import TableSchema, table_key

_WINDOW_COLUMNS = (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)
_VALIDITY_TYPES = ("timestamp with time zone", "timestamp without time zone", "date")
_ONE_STATEMENT = (
    "SELECT c.owner, sum(i.price) AS revenue, window_end AS t FROM TUMBLE(impsns, t, "
    "INTERVAL '1 minute') AS i JOIN campaigns c ON c.campaign = i.campaign "
    "GROUP BY c.owner, window_end"
)


def joins_on_read(select: exp.Expr, tables: Mapping[str, TableSchema]) -> bool:
    """A SELECT with joins that is computed on read: one whose inputs include a PostgreSQL
    table, or an outer join of three or more streams without aggregates (its padded rows
    depend on combinations a late row of any input may complete)."""
    if not isinstance(select, exp.Select) or not select.args.get("joins"):
        return False
    if any(isinstance(item, exp.Table) and table_key(item) in tables for item in _items(select)):
        return True
    joins = select.args["joins"]
    outer = any(j.args.get("side") for j in joins)
    aggregated = bool(select.args.get("group") or select.find(exp.AggFunc))
    return outer and len(joins) > 1 and not aggregated


def _items(select: exp.Select) -> list[exp.Expr | None]:
    from_ = select.args.get("from_")
    return [from_.this if from_ is not None else None] + [
        j.this for j in select.args.get("joins") or []
    ]


@dataclass(frozen=True)
class _Stream:
    position: int  # among the FROM items
    alias: str
    plan: RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan
    windowed: bool

    def columns(self) -> dict[str, str]:
        """Column name -> PostgreSQL type, window columns included when windowed."""
        columns = {c.name: c.type.pg() for c in self.plan.columns}
        if self.windowed:
            columns |= dict.fromkeys(_WINDOW_COLUMNS, "timestamp with time zone")
        return columns


@dataclass(frozen=True)
class _Table:
    position: int
    alias: str
    schema: TableSchema
    version: exp.Expr | None  # FOR SYSTEM_TIME AS OF <version>

    def columns(self) -> dict[str, str]:
        return {c.name: c.pg_type for c in self.schema.columns}


_Input = _Stream | _Table


def build_lookup(
    name: str,
    select: exp.Select,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema],
) -> ReadJoinStreamPlan | ParallelAggregatePlan:
    check_clauses(select)
    inputs = _inputs(select, streams, tables)
    owners = _Owners(inputs)
    if select.args.get("group") or select.args.get("having") or contains_aggregate(select):
        stream = _the_stream(inputs)
        _check_join_kinds(select, stream)
        return _aggregate(name, select, stream, inputs, owners, streams)
    return _on_read(name, select, inputs, owners)


# ---- inputs ------------------------------------------------------------------------------


def _inputs(
    select: exp.Select, streams: Mapping[str, StreamPlan], tables: Mapping[str, TableSchema]
) -> list[_Input]:
    inputs: list[_Input] = []
    for position, item in enumerate(_items(select)):
        entry = _input(position, item, streams, tables)
        if any(e.alias == entry.alias for e in inputs):
            raise UnsupportedSQL(
                f"{entry.alias!r} names two inputs of the join; give each its own alias"
            )
        inputs.append(entry)
    return inputs


def _input(
    position: int,
    item: exp.Expr | None,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema],
) -> _Input:
    if not isinstance(item, exp.Table):
        shown = item.sql("postgres") if item is not None else "nothing"
        raise UnsupportedSQL(f"a join reads streams and tables, not {shown!r}")
    call = item.this
    if isinstance(call, exp.Anonymous):
        if call.name.upper() not in ("TUMBLE", "HOP") or not call.expressions:
            raise UnsupportedSQL(
                f"{call.name.upper()}(...) is not a join input; join a stream, a TUMBLE or HOP "
                "window of one, or a table"
            )
        source = call.expressions[0]
        plan = streams.get(source.name) if isinstance(source, exp.Column) else None
        if plan is None:
            raise UnknownSource(f"stream {source.sql('postgres')!r} does not exist")
        if not item.alias:
            raise UnsupportedSQL(
                f"a windowed join input needs an alias: {call.name.upper()}(...) AS i"
            )
        return _Stream(position, item.alias, _row_stream(plan), windowed=True)
    key = table_key(item)
    version = item.args.get("version")
    if key is not None and key in streams and version is None:
        return _Stream(position, item.alias or key, _row_stream(streams[key]), windowed=False)
    if key is None or key not in tables:
        raise UnknownSource(
            f"{item.sql('postgres')!r} is neither a stream nor a table or view in PostgreSQL"
        )
    schema = tables[key]
    if version is not None:
        return _Table(position, item.alias or item.name, schema, _version(version, schema))
    return _Table(position, item.alias or item.name, schema, None)


def _row_stream(plan: StreamPlan) -> RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan:
    if isinstance(plan, RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan):
        return plan
    raise UnsupportedSQL(
        f"{plan.name!r} is not a stream of rows; a table joins a raw stream, a projection or "
        "a join stream (aggregate over the join in the same statement, e.g. "
        f"{_ONE_STATEMENT})"
    )


def _version(version: exp.Expr, schema: TableSchema) -> exp.Expr:
    kind = str(version.args.get("kind") or "").upper()
    if kind != "AS OF" or not isinstance(version.expression, exp.Expr):
        raise UnsupportedSQL(
            f"{version.sql('postgres')!r}: versioned joins read FOR SYSTEM_TIME AS OF "
            "stream_alias.time_column"
        )
    _validity(schema)
    return version.expression


def _validity(schema: TableSchema) -> tuple[str, tuple[str, ...]]:
    """(validity column, version key columns) of a versioned table: its primary key is the
    version key plus one column of a time type."""
    times = [
        k
        for k in schema.key
        if (c := schema.column(k)) is not None and c.pg_type in _VALIDITY_TYPES
    ]
    if len(times) != 1:
        raise UnsupportedSQL(
            f"FOR SYSTEM_TIME AS OF reads a versioned table: {schema.name!r} needs a PRIMARY "
            "KEY of its key columns and one validity column of type timestamptz, timestamp "
            "or date, e.g. PRIMARY KEY (currency, valid_from)"
        )
    return times[0], tuple(k for k in schema.key if k != times[0])


def _the_stream(inputs: list[_Input]) -> _Stream:
    streams = [e for e in inputs if isinstance(e, _Stream)]
    if not streams:
        raise UnsupportedSQL("a stream reads a stream: a join of tables alone is a PostgreSQL view")
    if len(streams) > 1:
        # Aggregates over several streams and tables are split first (split_join_aggregate):
        # the aggregate planned here reads their join stream.
        raise UnsupportedSQL(
            "a join of several streams and a table with aggregates reads the streams first, "
            "joined with JOIN, then the tables"
        )
    return streams[0]


def _check_join_kinds(select: exp.Select, stream: _Stream) -> None:
    for position, join in enumerate(select.args.get("joins") or [], start=1):
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        shown = " ".join(p for p in (side, kind, "JOIN") if p)
        if join.args.get("using"):
            raise UnsupportedSQL(
                "JOIN ... USING (...) is not supported; write the equality out, e.g. "
                "JOIN campaigns c ON c.campaign = i.campaign"
            )
        if kind in ("SEMI", "ANTI") or side in ("RIGHT", "FULL"):
            raise UnsupportedSQL(
                f"{shown} with a table is not supported: a stream-table join keeps rows of the "
                "stream; use JOIN, or FROM stream LEFT JOIN table"
            )
        if side == "LEFT" and position == stream.position:
            raise UnsupportedSQL(
                "LEFT JOIN keeps every row of its left side, here a table's; a stream-table "
                "join keeps rows of the stream: write FROM stream LEFT JOIN table"
            )
        if join.args.get("method") or join.args.get("global_"):
            raise UnsupportedSQL(f"{join.sql('postgres')!r}: use JOIN or LEFT JOIN")


class _Owners:
    """Which input each column reference reads."""

    def __init__(self, inputs: list[_Input]) -> None:
        self.inputs = inputs

    def of(self, column: exp.Column) -> _Input:
        name, alias = column.name, column.table
        if alias:
            entry = next((e for e in self.inputs if e.alias == alias), None)
            if entry is None:
                known = ", ".join(e.alias for e in self.inputs)
                raise UnsupportedSQL(f"{alias!r} is not an input of the join (inputs: {known})")
            if name not in entry.columns():
                raise UnsupportedSQL(f"column {name!r} of {alias!r} does not exist")
            return entry
        owners = [e for e in self.inputs if name in e.columns()]
        if not owners:
            raise UnsupportedSQL(f"column {name!r} does not exist in the joined inputs")
        if len(owners) > 1:
            choices = " or ".join(f"{e.alias}.{name}" for e in owners)
            raise UnsupportedSQL(f"column {name!r} is ambiguous in the join; write {choices}")
        return owners[0]

    def aliases(self, node: exp.Expr) -> set[str]:
        return {
            self.of(c).alias for c in node.find_all(exp.Column) if not isinstance(c.this, exp.Star)
        }


def _versioned(
    join_item: exp.Table, entry: _Table, on: exp.Expr | None, version: exp.Expr
) -> exp.Lateral:
    """The version of ``entry`` valid at ``version``, for each row: a LATERAL subquery of the
    row with the key the ON condition equates and the greatest validity not after it."""
    validity, key = _validity(entry.schema)
    alias = entry.alias
    equalities: dict[str, exp.Expr] = {}
    for conjunct in conjuncts(on):
        if not isinstance(conjunct, exp.EQ):
            continue
        for mine, other in (
            (conjunct.this, conjunct.expression),
            (conjunct.expression, conjunct.this),
        ):
            if (
                isinstance(mine, exp.Column)
                and mine.table == alias
                and mine.name in key
                and not any(c.table == alias for c in other.find_all(exp.Column))
            ):
                equalities.setdefault(mine.name, other)
    missing = [k for k in key if k not in equalities]
    if missing:
        raise UnsupportedSQL(
            f"FOR SYSTEM_TIME AS OF finds the version of {entry.schema.name!r} by its key: add "
            + " AND ".join(f"{alias}.{k} = ..." for k in missing)
            + " to the ON condition"
        )
    plain = join_item.copy()
    plain.set("version", None)
    plain.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    own = exp.column(validity, table=alias, quoted=True)
    conditions: list[exp.Expr] = [
        exp.EQ(this=exp.column(k, table=alias, quoted=True), expression=equalities[k].copy())
        for k in key
    ]
    conditions.append(exp.LTE(this=own.copy(), expression=version.copy()))
    latest = (
        exp.select(exp.Star())
        .from_(plain)
        .where(exp.and_(*conditions))
        .order_by(exp.Ordered(this=own, desc=True))
        .limit(1)
    )
    return exp.Lateral(this=latest.subquery(), alias=exp.TableAlias(this=exp.to_identifier(alias)))


def _replace_items(
    view: exp.Select,
    inputs: list[_Input],
    stream_item: Callable[[_Stream], exp.Expr],
    translate: Callable[[exp.Expr], exp.Expr],
) -> None:
    """Put each stream's rows (``stream_item``) and the tables' versions in place of the
    FROM items of ``view``, and the translated ON conditions."""
    joins = view.args.get("joins") or []
    for entry in inputs:
        if entry.position == 0:
            holder: exp.Expr = view.args["from_"]
            on = None
        else:
            holder = joins[entry.position - 1]
            on = holder.args.get("on")
            if on is not None:
                on = translate(on)
                holder.set("on", on)
        if isinstance(entry, _Stream):
            holder.set("this", stream_item(entry))
        elif entry.version is not None:
            if entry.position == 0:
                raise UnsupportedSQL(
                    "a versioned table is joined to a stream row: write FROM stream JOIN "
                    "table FOR SYSTEM_TIME AS OF stream.time ..."
                )
            holder.set("this", _versioned(holder.this, entry, on, translate(entry.version)))


# ---- a join computed on read --------------------------------------------------------------


def _on_read(
    name: str, select: exp.Select, inputs: list[_Input], owners: _Owners
) -> ReadJoinStreamPlan:
    joined = [e for e in inputs if isinstance(e, _Stream)]
    if not joined:
        raise UnsupportedSQL("a stream reads a stream: a join of tables alone is a PostgreSQL view")
    if any(e.windowed for e in joined):
        raise UnsupportedSQL(
            "a windowed stream in a join computed on read (with a table, or an outer join of "
            f"three or more streams) is for aggregates over a table, e.g. {_ONE_STATEMENT}; "
            "otherwise join the streams themselves"
        )
    for join in select.args.get("joins") or []:
        kind = (join.args.get("kind") or "").upper()
        if kind in ("SEMI", "ANTI") or join.args.get("using") or join.args.get("method"):
            raise UnsupportedSQL(
                f"{join.sql('postgres')!r} is not supported: write [LEFT|RIGHT|FULL] JOIN ... "
                "ON with the equality written out"
            )

    def qualify(node: exp.Expr) -> exp.Expr:
        copy = node.copy()
        for column in list(copy.find_all(exp.Column)):
            if not isinstance(column.this, exp.Star):
                column.set("table", exp.to_identifier(owners.of(column).alias))
        return copy

    view = select.copy()
    outputs = _outputs(select, inputs, owners, qualify)
    view.set("expressions", [exp.alias_(e, n, quoted=True) for n, e, _ in outputs])
    if view.args.get("where") is not None:
        view.set("where", exp.Where(this=qualify(view.args["where"].this)))

    def rows(entry: _Stream) -> exp.Expr:
        return exp.alias_(table(entry.plan.name, naming.PUBLIC_SCHEMA), entry.alias, table=True)

    _replace_items(view, inputs, rows, qualify)
    event_time = next(
        (
            n
            for n, e, owner in outputs
            if isinstance(owner, _Stream)
            and isinstance(e, exp.Column)
            and e.name == owner.plan.event_time
        ),
        None,
    )
    return ReadJoinStreamPlan(
        name=name,
        sources=tuple(dict.fromkeys(e.plan.name for e in joined)),
        raw_sources=tuple(dict.fromkeys(r for e in joined for r in _raw_sources(e.plan))),
        columns=tuple(_column(n, e, owner, joined) for n, e, owner in outputs),
        event_time=event_time,
        tables=tuple(e.schema.name for e in inputs if isinstance(e, _Table)),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )


def _raw_sources(plan: RawStreamPlan | ProjectionStreamPlan | JoinStreamPlan) -> tuple[str, ...]:
    return (plan.name,) if isinstance(plan, RawStreamPlan) else plan.raw_sources


def _outputs(
    select: exp.Select,
    inputs: list[_Input],
    owners: _Owners,
    qualify: Callable[[exp.Expr], exp.Expr],
) -> list[tuple[str, exp.Expr, _Input | None]]:
    """(name, expression over the inputs, the input a plain column comes from) per column."""
    outputs: list[tuple[str, exp.Expr, _Input | None]] = []
    for item in select.expressions:
        star = isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        )
        if star:
            alias = item.table if isinstance(item, exp.Column) else ""
            chosen = [e for e in inputs if not alias or e.alias == alias]
            if not chosen:
                raise UnsupportedSQL(f"{alias!r} is not an input of the join")
            for entry in chosen:
                for column in entry.columns():
                    outputs.append(
                        (column, exp.column(column, table=entry.alias, quoted=True), entry)
                    )
            continue
        expression = qualify(item.this if isinstance(item, exp.Alias) else item)
        owner = owners.of(expression) if isinstance(expression, exp.Column) else None
        outputs.append(
            (naming.check_column_name(output_name(item), window_names=True), expression, owner)
        )
    names = [n for n, _, _ in outputs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UnsupportedSQL(
            f"the join selects two columns named {', '.join(map(repr, twice))}; name them "
            "apart with AS, e.g. SELECT i.id AS impression_id, c.id AS campaign_id"
        )
    return outputs


def _column(
    name: str, expression: exp.Expr, owner: _Input | None, joined: list[_Stream]
) -> OutputColumn:
    if owner is not None and isinstance(expression, exp.Column):
        return OutputColumn(name, owner.columns()[expression.name])
    aliases = {c.table for c in expression.find_all(exp.Column)}
    stream = next((e for e in joined if {e.alias} == aliases), None)
    if stream is not None and not contains_aggregate(expression):
        schema = {c.name: c.type for c in stream.plan.columns}
        unqualified = expression.copy()
        for column in list(unqualified.find_all(exp.Column)):
            column.set("table", None)
        try:
            return OutputColumn(name, infer_type(unqualified, schema).pg())
        except UnsupportedSQL:
            pass
    return OutputColumn(name, None)


# ---- aggregates over a stream-table join ---------------------------------------------------


def _unqualified(node: exp.Expr) -> exp.Expr:
    copy = node.copy()
    for column in list(copy.find_all(exp.Column)):
        column.set("table", None)
    return copy


def _aggregate_calls(node: exp.Expr) -> list[exp.Expr]:
    if is_aggregate(node):
        return [node]
    return [call for child in node.iter_expressions() for call in _aggregate_calls(child)]


def _outside_aggregates(node: exp.Expr) -> list[exp.Column]:
    if is_aggregate(node):
        return []
    if isinstance(node, exp.Column):
        return [node]
    return [c for child in node.iter_expressions() for c in _outside_aggregates(child)]


def _aggregate(
    name: str,
    select: exp.Select,
    stream: _Stream,
    inputs: list[_Input],
    owners: _Owners,
    streams: Mapping[str, StreamPlan],
) -> ParallelAggregatePlan:
    if not stream.windowed:
        raise UnsupportedSQL(
            "aggregates over a stream-table join group by a window of the stream: read it as "
            f"TUMBLE(...) or HOP(...) AS alias, e.g. {_ONE_STATEMENT}"
        )
    if any(
        isinstance(i, exp.Star) or (isinstance(i, exp.Column) and isinstance(i.this, exp.Star))
        for i in select.expressions
    ):
        raise UnsupportedSQL("SELECT * is not supported with GROUP BY; name the columns")
    where = select.args.get("where")
    pushed: list[exp.Expr] = []
    kept: list[exp.Expr] = []
    for conjunct in conjuncts(where.this if where is not None else None):
        if contains_aggregate(conjunct):
            raise UnsupportedSQL("aggregates are not allowed in WHERE; use HAVING")
        windowed = any(c.name in _WINDOW_COLUMNS for c in conjunct.find_all(exp.Column))
        if owners.aliases(conjunct) == {stream.alias} and not windowed:
            pushed.append(conjunct)
        else:
            kept.append(conjunct)
    all_columns = {c for e in inputs for c in e.columns()}
    group_keys = group_by_keys(select, all_columns)
    having = select.args.get("having")
    read: list[exp.Expr] = [*select.expressions, *kept, *group_keys]
    read += [j.args["on"] for j in select.args.get("joins") or [] if j.args.get("on")]
    read += [e.version for e in inputs if isinstance(e, _Table) and e.version is not None]
    if having is not None:
        read.append(having.this)
    keys: dict[str, None] = {}
    calls: dict[str, exp.Expr] = {}
    for part in read:
        for column in _outside_aggregates(part):
            if isinstance(column.this, exp.Star):
                continue
            if owners.of(column) is stream and column.name not in _WINDOW_COLUMNS:
                keys[column.name] = None
        for call in _aggregate_calls(part):
            readers = owners.aliases(call)
            if readers - {stream.alias} or any(
                c.name in _WINDOW_COLUMNS for c in call.find_all(exp.Column)
            ):
                raise UnsupportedSQL(
                    f"{call.sql('postgres')!r}: aggregates over a stream-table join take the "
                    f"stream's columns ({stream.alias}.*); the table's columns can be GROUP BY "
                    "keys and filters"
                )
            calls.setdefault(_unqualified(call).sql("postgres"), _unqualified(call))
    window, split = _split_stream_side(select, stream, list(keys), calls, pushed, streams)
    by_call = {a.call: a for a in split.aggregates}
    key_columns = {k.expression.name: k.column for k in split.keys}

    def translate(node: exp.Expr) -> exp.Expr:
        if is_aggregate(node):
            final = by_call[_unqualified(node).sql("postgres")].final.copy()
            for column in list(final.find_all(exp.Column)):
                if not column.table:  # a state (a final's subquery qualifies its own)
                    column.set("table", exp.to_identifier(stream.alias))
            return final
        if isinstance(node, exp.Column) and not isinstance(node.this, exp.Star):
            owner = owners.of(node)
            if owner is not stream:
                return exp.column(node.name, table=owner.alias, quoted=True)
            start = exp.column(naming.WINDOW_START_COLUMN, table=stream.alias, quoted=True)
            if node.name == naming.WINDOW_START_COLUMN:
                return start
            if node.name == naming.WINDOW_END_COLUMN:
                size = fixed_interval(window.size_us)
                return exp.Add(this=start, expression=size)
            return exp.column(key_columns[node.name], table=stream.alias, quoted=True)
        copy = node.copy()
        for child in list(copy.iter_expressions()):
            child.replace(translate(child))
        return copy

    view = select.copy()
    items = []
    columns = []
    read_keys = [k.sql("postgres") for k in group_keys]
    for item in select.expressions:
        output = naming.check_column_name(output_name(item), window_names=True)
        expression = item.this if isinstance(item, exp.Alias) else item
        items.append(exp.alias_(translate(expression), output, quoted=True))
        shown = _aggregate_column(output, expression, owners, stream, by_call)
        if expression.sql("postgres") in read_keys:  # a row's key, as the feed shows it
            shown = dataclasses.replace(shown, role="group", ref=expression.sql("postgres"))
        columns.append(shown)
    view.set("expressions", items)
    view.set("where", exp.Where(this=exp.and_(*map(translate, kept))) if kept else None)
    view.set(
        "group",
        exp.Group(
            expressions=[
                exp.column(naming.WINDOW_START_COLUMN, table=stream.alias, quoted=True),
                *(translate(k) for k in group_keys),
            ]
        ),
    )
    if having is not None:
        view.set("having", exp.Having(this=translate(having.this)))
    joined_view = view.copy()

    def over(rows: exp.Expr) -> exp.Select:
        """The view's query over the given partial rows of the stream."""
        query = joined_view.copy()
        item = exp.alias_(rows, stream.alias, table=True)
        _replace_items(query, inputs, lambda _: item.copy(), translate)
        return query

    rows = exp.alias_(partial_rows(name, split, window), stream.alias, table=True)
    _replace_items(view, inputs, lambda _: rows, translate)
    table_names = [e.schema.name for e in inputs if isinstance(e, _Table)]
    joined_rows = build_joined(
        name,
        split,
        window,
        over,
        [c.name for c in columns],
        [c.name for c in columns if c.role in _WINDOW_COLUMNS],
        [_quoted(n) for n in table_names],
    )
    plan = build_views(name, split, window)
    *tables, _ = plan.create_statements
    joined = ", ".join(table_names)
    return dataclasses.replace(
        plan,
        # What the view computes: every window joined on read (the joined rows are that
        # query's rows of reduced windows, kept); the view itself is the last statement.
        view_query=view.sql("postgres"),
        create_statements=(
            *tables,
            *joined_rows.create_statements,
            create_view(name, joined_rows.view),
        ),
        drop_statements=(*plan.drop_statements, *joined_rows.drop_statements),
        reduce_statement=reduce_statement(name, split, window, also=joined_rows.fold_steps),
        joined=joined_rows.rows,
        outputs=tuple(columns),
        tables=tuple(e.schema.name for e in inputs if isinstance(e, _Table)),
        read_keys=tuple(read_keys),
        parallelism_reason=(
            f"aggregates pushed below the join with {joined}: partials per run, window and "
            f"join columns of {stream.plan.name!r} in Spark; the table joined and the "
            "partials merged on read in PostgreSQL, so results follow the table's current "
            "content"
        ),
    )


def _quoted(name: str) -> str:
    """A table's name as TableSchema holds it (``table`` or ``schema.table``, folded as
    PostgreSQL folds) quoted, so that PostgreSQL reads it as that table."""
    return ".".join(exp.to_identifier(p, quoted=True).sql("postgres") for p in name.split(".", 1))


def _split_stream_side(
    select: exp.Select,
    stream: _Stream,
    keys: list[str],
    calls: dict[str, exp.Expr],
    pushed: list[exp.Expr],
    streams: Mapping[str, StreamPlan],
) -> tuple[WindowSpec, SplitQuery]:
    """The windowed aggregate over the stream alone whose partials the view joins: grouped
    by the window and the join columns, with the filters on the stream's own columns."""
    item = _items(select)[stream.position]
    assert isinstance(item, exp.Table)
    windowed = exp.Table(this=item.this.copy())
    taken = set(keys)
    aliases = []
    for index in range(len(calls)):
        alias = f"aggregate_{index}"
        while alias in taken:
            alias = f"_{alias}"
        taken.add(alias)
        aliases.append(alias)
    synthetic = exp.select(
        *(exp.column(k, quoted=True) for k in keys),
        *(
            exp.alias_(c.copy(), a, quoted=True)
            for c, a in zip(calls.values(), aliases, strict=True)
        ),
    ).from_(windowed)
    if pushed:
        synthetic = synthetic.where(exp.and_(*map(_unqualified, pushed)))
    synthetic = synthetic.group_by(
        *(exp.column(k, quoted=True) for k in keys), exp.column(naming.WINDOW_START_COLUMN)
    )
    window = resolve_window(synthetic, streams)
    source = window.source
    if isinstance(source, JoinStreamPlan) and source.preserved:
        raise UnsupportedSQL(
            f"aggregates over the outer join {source.name!r} are not supported yet; build "
            "them over an inner join"
        )
    return window, split_aggregates(synthetic, window)


def _aggregate_column(
    name: str,
    expression: exp.Expr,
    owners: _Owners,
    stream: _Stream,
    by_call: dict[str, SplitAggregate],
) -> OutputColumn:
    if is_aggregate(expression):
        return OutputColumn(name, by_call[_unqualified(expression).sql("postgres")].result_type)
    if isinstance(expression, exp.Column):
        owner = owners.of(expression)
        if owner is stream and expression.name in _WINDOW_COLUMNS:
            return OutputColumn(name, "timestamptz", expression.name)
        return OutputColumn(name, owner.columns()[expression.name])
    return OutputColumn(name, None)
