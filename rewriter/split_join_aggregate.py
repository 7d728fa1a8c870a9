"""Pass 3f: aggregates over a join of streams in one statement, split into a join stream
and an aggregate over it.

``SELECT a.seller, count(*) AS n, window_start FROM TUMBLE(bid, date_time, INTERVAL
'10 minutes') b JOIN auction a ON a.id = b.auction GROUP BY a.seller, window_start`` is
the join ``CREATE STREAM <name>__rows AS SELECT b.date_time AS b__date_time, a.seller AS
a__seller FROM ...`` (every input column the aggregate reads, named alias__column, and the
windowed input's event time first, so that it is the join's event time) and the aggregate
over it, ``SELECT a__seller AS seller, count(*) AS n, window_start FROM
TUMBLE(<name>__rows, b__date_time, INTERVAL '10 minutes') GROUP BY a__seller,
window_start``. The join stream is an ordinary one (build_join): exact under any lateness,
its rows archived; the aggregate takes partials per run of the rows each run adds to it.
The window is the first windowed input's: its window_start and window_end are the
aggregate's. Without a windowed input, the aggregate is running totals over the join (the
join stream keeps the first input's event time).

With PostgreSQL tables among the inputs (``FROM TUMBLE(bid, ...) b JOIN auction a ON ...
JOIN category_names c ON a.category = c.id``), the join stream is the join of the streams
alone, and the aggregate joins it with the tables: ``... FROM TUMBLE(<name>__rows,
b__date_time, ...) AS <name>__rows JOIN category_names c ON <name>__rows.a__category =
c.id``, a stream-table join (build_lookup) that follows the tables' current content. The
streams come first, joined with JOIN, the tables after them: the statement is then (the
streams' inner join) joined with each table in turn, which is exactly what the two stages
compute; WHERE conditions that read a table are checked in the aggregate, the others in
the join stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.derived_select import output_name
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.expressions import conjuncts
from rewriter.plan import RawStreamPlan, StreamPlan
from rewriter.resolve_window import parse_interval
from rewriter.tables import TableSchema, table_key

_WINDOW_COLUMNS = (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)


@dataclass(frozen=True)
class JoinAggregate:
    rows_stream: str  # the join stream's name
    rows_statement: str  # CREATE STREAM of the join stream
    aggregate: exp.Select  # the aggregate over it


def join_rows_statement(
    name: str,
    select: exp.Expr,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
) -> tuple[str, str] | None:
    """(name, CREATE STREAM) of the join stream an aggregate over a join in one statement
    is built on, for the server to create first; None for any other statement."""
    if not is_join_aggregate(select):
        return None
    assert isinstance(select, exp.Select)
    if _joined_tables(select, tables or {}) and not joins_streams_and_tables(select, tables or {}):
        return None  # one stream and tables: build_lookup aggregates the stream itself
    split = split_join_aggregate(name, select, streams, tables)
    return split.rows_stream, split.rows_statement


def joins_streams_and_tables(select: exp.Expr, tables: Mapping[str, TableSchema]) -> bool:
    """An aggregate over a join of two or more streams and PostgreSQL tables."""
    if not is_join_aggregate(select):
        return False
    assert isinstance(select, exp.Select)
    joined = _joined_tables(select, tables)
    return bool(joined) and len(_items(select)) - len(joined) > 1


def is_join_aggregate(select: exp.Expr) -> bool:
    return (
        isinstance(select, exp.Select)
        and bool(select.args.get("joins"))
        and bool(select.args.get("group") or select.args.get("having") or select.find(exp.AggFunc))
    )


def split_join_aggregate(
    name: str,
    select: exp.Select,
    streams: Mapping[str, StreamPlan],
    tables: Mapping[str, TableSchema] | None = None,
) -> JoinAggregate:
    rows_stream = naming.join_rows_stream(name)
    if len(rows_stream) > naming.MAX_STREAM_NAME:
        raise UnsupportedSQL(
            f"an aggregate over a join keeps the join as the stream {rows_stream!r}, longer "
            f"than {naming.MAX_STREAM_NAME} characters: choose a shorter name"
        )
    joined_tables = _joined_tables(select, tables or {})
    if joined_tables:
        _check_streams_first(select, joined_tables)
    # With tables, the aggregate joins the join stream with them: it needs an alias.
    rows_alias = rows_stream if joined_tables else None
    inputs = _inputs(select, joined_tables)
    windowed = [(a, e.window) for a, e in inputs.items() if e.window is not None]
    if windowed:
        first, call = windowed[0]
        assert call is not None
        size = parse_interval(call.expressions[2])
        if any(c is not None and parse_interval(c.expressions[2]) != size for _, c in windowed):
            raise UnsupportedSQL("the windowed inputs of an aggregate over a join share one size")
        time_column = call.expressions[1].name
        source: exp.Expr = exp.Table(
            this=exp.Anonymous(
                this="TUMBLE",
                expressions=[
                    exp.column(rows_stream),
                    exp.column(naming.join_column(first, time_column), quoted=True),
                    call.expressions[2].copy(),
                ],
            ),
            alias=exp.TableAlias(this=exp.to_identifier(rows_alias)) if rows_alias else None,
        )
    else:
        # Without a window: running totals over the join (its event time is the first
        # input's, which a join stream must keep).
        first = next(iter(inputs))
        plan = streams.get(inputs[first].source)
        if plan is None:
            raise UnknownSource(
                f"{inputs[first].source!r} does not exist: it is neither a stream nor a table "
                "or view in PostgreSQL"
            )
        if not isinstance(plan, RawStreamPlan):
            raise UnsupportedSQL(
                f"{plan.name!r} is a derived stream; joins read raw streams (join them first, "
                "then build streams on the join)"
            )
        time_column = plan.event_time
        source = exp.table_(rows_stream, alias=rows_alias)
    time = naming.join_column(first, time_column)
    columns: dict[str, exp.Column] = {time: exp.column(time_column, table=first)}

    def reader(column: exp.Column) -> str | None:
        """The alias of the input ``column`` reads; None for the window."""
        if column.table:
            return column.table
        if column.name in _WINDOW_COLUMNS and not any(
            t.column(column.name) for t in joined_tables.values()
        ):
            return None
        return _owner(column.name, inputs, streams, joined_tables)

    def flatten(node: exp.Expr) -> exp.Expr:
        copy = node.copy()
        targets = [copy] if isinstance(copy, exp.Column) else list(copy.find_all(exp.Column))
        for column in targets:
            if isinstance(column.this, exp.Star):
                raise UnsupportedSQL("SELECT * is not supported with GROUP BY; name the columns")
            alias = reader(column)
            if alias in joined_tables:
                # A table's column: the aggregate joins the table itself.
                replacement: exp.Expr = exp.column(column.this.copy(), table=alias)
            elif column.name in _WINDOW_COLUMNS:
                if not windowed:
                    raise UnsupportedSQL(
                        f"{column.sql('postgres')!r}: the join reads no window; read one input "
                        "as TUMBLE(stream, time_column, INTERVAL '...') AS alias"
                    )
                if column.table and column.table != first:
                    raise UnsupportedSQL(
                        f"{column.sql('postgres')!r}: an aggregate over a join is windowed by "
                        f"its first windowed input, {first!r}: use {first}.{column.name}"
                    )
                replacement = exp.column(column.name, table=rows_alias)
            else:
                if alias is None or alias not in inputs:
                    raise UnsupportedSQL(f"{alias!r} is not an input of the join")
                flat = naming.join_column(alias, column.name)
                columns.setdefault(flat, exp.column(column.name, table=alias))
                replacement = exp.column(flat, table=rows_alias, quoted=True)
            if column is copy:
                return replacement
            column.replace(replacement)
        return copy

    items = []
    for item in select.expressions:
        shown = output_name(item)
        inner = item.this if isinstance(item, exp.Alias) else item
        items.append(exp.alias_(flatten(inner), shown, quoted=True))
    aggregate = exp.select(*items).from_(source)
    group = select.args.get("group")
    if group is not None:
        aggregate.set(
            "group",
            exp.Group(
                expressions=[
                    _grouped(g, select, inputs, joined_tables, streams, flatten)
                    for g in group.expressions
                ]
            ),
        )
    having = select.args.get("having")
    if having is not None:
        aggregate.set("having", exp.Having(this=flatten(having.this)))
    rows = select.copy()
    if joined_tables:
        stream_joins: list[exp.Expr] = []
        table_joins: list[exp.Expr] = []
        for join in select.args.get("joins") or []:
            chosen = table_joins if _alias(join.this) in joined_tables else stream_joins
            chosen.append(join)
        aggregate.set("joins", [_flattened_join(j, flatten) for j in table_joins])
        where = select.args.get("where")
        stream_conditions: list[exp.Expr] = []
        table_conditions: list[exp.Expr] = []
        for conjunct in conjuncts(where.this if where is not None else None):
            reads = {
                reader(c) for c in conjunct.find_all(exp.Column) if not isinstance(c.this, exp.Star)
            }
            chosen = table_conditions if reads & set(joined_tables) else stream_conditions
            chosen.append(conjunct)
        if table_conditions:
            aggregate.set("where", exp.Where(this=flatten(exp.and_(*table_conditions))))
        rows.set("joins", [j.copy() for j in stream_joins])
        rows.set(
            "where", exp.Where(this=exp.and_(*stream_conditions)) if stream_conditions else None
        )
    rows.set(
        "expressions",
        [exp.alias_(source, flat, quoted=True) for flat, source in columns.items()],
    )
    for clause in ("group", "having", "distinct"):
        rows.set(clause, None)
    statement = f"CREATE STREAM {rows_stream} AS {rows.sql('postgres')}"
    return JoinAggregate(rows_stream, statement, aggregate)


def _grouped(
    item: exp.Expr,
    select: exp.Select,
    inputs: Mapping[str, _Input],
    joined_tables: Mapping[str, TableSchema],
    streams: Mapping[str, StreamPlan],
    flatten: Callable[[exp.Expr], exp.Expr],
) -> exp.Expr:
    """A GROUP BY item over the join stream. As in PostgreSQL, a name is an input column
    if an input has it, else a SELECT alias (kept, as the aggregate's SELECT keeps the
    names); positions stay as written."""
    if isinstance(item, exp.Literal) and not item.is_string:
        return item.copy()
    aliases = {i.alias for i in select.expressions if isinstance(i, exp.Alias)}
    if (
        isinstance(item, exp.Column)
        and not item.table
        and item.name in aliases
        and item.name not in _WINDOW_COLUMNS
        and not any(_has(entry, item.name, streams) for entry in inputs.values())
        and not any(t.column(item.name) for t in joined_tables.values())
    ):
        return item.copy()
    return flatten(item)


@dataclass(frozen=True)
class _Input:
    source: str
    window: exp.Anonymous | None  # TUMBLE(...) of a windowed input


def _items(select: exp.Select) -> list[exp.Expr | None]:
    from_ = select.args.get("from_")
    return [from_.this if from_ is not None else None] + [
        j.this for j in select.args.get("joins") or []
    ]


def _alias(item: exp.Expr | None) -> str | None:
    if not isinstance(item, exp.Table):
        return None
    if isinstance(item.this, exp.Anonymous):
        return item.alias or None
    return item.alias or item.name


def _joined_tables(select: exp.Select, tables: Mapping[str, TableSchema]) -> dict[str, TableSchema]:
    """The PostgreSQL tables among the join's inputs, by alias, in FROM order."""
    joined: dict[str, TableSchema] = {}
    for item in _items(select):
        if isinstance(item, exp.Table) and (key := table_key(item)) in tables:
            joined[item.alias or item.name] = tables[key]  # type: ignore[index]
    return joined


def _check_streams_first(select: exp.Select, joined_tables: Mapping[str, TableSchema]) -> None:
    """The streams are joined first, with inner joins, then the tables: so the join stream
    is the streams' join, and the aggregate that join with each table in turn."""
    shape = (
        "an aggregate over a join of several streams and a table reads the streams first, "
        "joined with JOIN, then the tables, e.g. FROM TUMBLE(bid, date_time, INTERVAL "
        "'10 seconds') b JOIN auction a ON a.id = b.auction JOIN category_names c ON "
        "c.id = a.category"
    )
    items = _items(select)
    joins = select.args.get("joins") or []
    seen_table = False
    for position, item in enumerate(items):
        if _alias(item) in joined_tables:
            seen_table = True
            continue
        if seen_table:
            raise UnsupportedSQL(f"{shape}; here a stream follows a table")
        if position == 0:
            continue
        join = joins[position - 1]
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if side or kind not in ("", "INNER") or join.args.get("using"):
            written = " ".join(p for p in (side, kind, "JOIN") if p)
            raise UnsupportedSQL(
                f"{shape}; here the streams are joined with {written}"
                + (" USING (...)" if join.args.get("using") else "")
            )


def _flattened_join(join: exp.Expr, flatten: Callable[[exp.Expr], exp.Expr]) -> exp.Expr:
    """A table's join over the join stream: its ON and its FOR SYSTEM_TIME AS OF read the
    join stream's columns."""
    copy = join.copy()
    on = copy.args.get("on")
    if on is not None:
        copy.set("on", flatten(on))
    version = copy.this.args.get("version")
    if version is not None and isinstance(version.expression, exp.Expr):
        version.set("expression", flatten(version.expression))
    return copy


def _inputs(
    select: exp.Select, joined_tables: Mapping[str, TableSchema] | None = None
) -> dict[str, _Input]:
    """The streams among the join's inputs, by alias."""
    inputs: dict[str, _Input] = {}
    for item in _items(select):
        if not isinstance(item, exp.Table):
            continue  # build_join names what is wrong with it
        if joined_tables and _alias(item) in joined_tables:
            continue
        call = item.this if isinstance(item.this, exp.Anonymous) else None
        if call is None:
            inputs[item.alias or item.name] = _Input(item.name, None)
            continue
        if (
            call.name.upper() != "TUMBLE"
            or len(call.expressions) != 3
            or not all(isinstance(a, exp.Column) for a in call.expressions[:2])
        ):
            raise UnsupportedSQL(
                "a windowed input of an aggregate over a join is TUMBLE(stream, time_column, "
                "INTERVAL '...') AS alias"
            )
        inputs[item.alias or call.expressions[0].name] = _Input(call.expressions[0].name, call)
    return inputs


def _owner(
    column: str,
    inputs: Mapping[str, _Input],
    streams: Mapping[str, StreamPlan],
    joined_tables: Mapping[str, TableSchema],
) -> str:
    """The input an unqualified column belongs to."""
    owners = [alias for alias, entry in inputs.items() if _has(entry, column, streams)]
    owners += [alias for alias, schema in joined_tables.items() if schema.column(column)]
    if len(owners) == 1:
        return owners[0]
    if owners:
        choices = " or ".join(f"{a}.{column}" for a in owners)
        raise UnsupportedSQL(f"column {column!r} is ambiguous in the join; write {choices}")
    raise UnsupportedSQL(f"column {column!r} does not exist in the joined inputs")


def _has(entry: _Input, column: str, streams: Mapping[str, StreamPlan]) -> bool:
    plan = streams.get(entry.source)
    return isinstance(plan, RawStreamPlan) and column in {c.name for c in plan.columns}
