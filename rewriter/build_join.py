"""Pass 3d: a stream that joins raw streams (seeds/001, seeds/004).

``SELECT ... FROM a x JOIN b y ON ... [JOIN c z ON ...] [WHERE ...]``: inner joins (JOIN,
CROSS JOIN, commas) of raw streams, each under an alias, windowed with TUMBLE or not, with
any condition the row expressions allow (equalities, bands such as
``b.t BETWEEN a.t AND a.expires``, ``x.window_start = y.window_start``, inequalities). The
output is a stream of rows with an event time (a time column of the SELECT list), so that
windows and roll-ups can be built on it like on a raw stream.

Every input column is renamed ``alias__column`` (naming.join_column), so that the row
expressions, typed and translated as everywhere else, see one flat schema. The conjuncts
of the condition are also read as *probe links*: which rows of one input another input's
rows can match (equal keys, time ranges), so that a batch reads only that slice of the
other inputs from PostgreSQL. A link only narrows what is read; Spark evaluates the whole
condition on it, so exactness never depends on the links.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import column_def, create_index, create_table, create_view, drop, table
from rewriter.derived_select import check_clauses, output_name
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.expressions import BOOLEAN, conjuncts, infer_type, to_spark
from rewriter.plan import JoinInput, JoinStreamPlan, ProbeKind, ProbeLink, RawStreamPlan, StreamPlan
from rewriter.resolve_window import WINDOW_FORM, parse_interval
from rewriter.types import ColumnSpec, SqlType
from rewriter.window_forms import window_start_spark

JOIN_FORMS = (
    "a JOIN b ON <condition> (also CROSS JOIN, commas with WHERE, and TUMBLE(stream, "
    "time_column, INTERVAL '...') AS alias as an input)"
)
_TIMESTAMPTZ = SqlType("timestamptz")


def is_join(select: exp.Expr) -> bool:
    return isinstance(select, exp.Select) and bool(select.args.get("joins"))


@dataclass(frozen=True)
class _Input:
    alias: str
    source: RawStreamPlan
    window_us: int | None

    def schema(self) -> dict[str, SqlType]:
        """The input's columns under their joined names (window columns included)."""
        columns = {naming.join_column(self.alias, c.name): c.type for c in self.source.columns}
        if self.window_us is not None:
            for column in (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN):
                columns[naming.join_column(self.alias, column)] = _TIMESTAMPTZ
        return columns


def build_join(name: str, select: exp.Select, streams: Mapping[str, StreamPlan]) -> JoinStreamPlan:
    check_clauses(select)
    if select.args.get("group") or select.args.get("having") or select.find(exp.AggFunc):
        raise UnsupportedSQL(
            "aggregates over a join are planned over a join stream: create the join as a "
            "stream, then aggregate over it with TUMBLE(join_stream, time_column, INTERVAL "
            "'...')"
        )
    inputs = _inputs(select, streams)
    schema: dict[str, SqlType] = {}
    for entry in inputs:
        clash = sorted(schema.keys() & entry.schema().keys())
        if clash:
            raise UnsupportedSQL(
                f"the alias {entry.alias!r} and a column name run together as {clash[0]!r}; "
                "choose aliases without double underscores"
            )
        schema |= entry.schema()
    preserved = _preserved(select, len(inputs))
    qualified = _qualify(select, inputs)
    matching, filtering = _conditions(qualified)
    conjuncts = matching + filtering
    for conjunct in conjuncts:
        if infer_type(conjunct, schema) != BOOLEAN:
            raise UnsupportedSQL(f"a join condition must be boolean: {conjunct.sql('postgres')!r}")
    outputs = _outputs(select, qualified, inputs)
    event_time, time_input, time_column = _event_time(outputs, inputs, preserved)
    if event_time == naming.HIDDEN_EVENT_TIME:  # archived for streams built on it, not shown
        joined = naming.join_column(inputs[time_input].alias, time_column)
        outputs.append((event_time, exp.column(joined, quoted=True)))
    columns = tuple(ColumnSpec(n, infer_type(e, schema)) for n, e in outputs)
    shown = tuple(c for c in columns if c.name != naming.HIDDEN_EVENT_TIME)
    owners = {column: k for k, entry in enumerate(inputs) for column in entry.schema()}
    planned_inputs = tuple(
        JoinInput(
            alias=entry.alias,
            source=entry.source.name,
            columns=entry.source.columns,
            event_time=entry.source.event_time,
            window_us=entry.window_us,
            filter_sql=_input_filter(conjuncts, k, entry, owners),
        )
        for k, entry in enumerate(inputs)
    )
    links = tuple(link for c in conjuncts for link in _links(c, inputs, owners))
    archive = table(naming.join_archive_table(name))
    view = _view(name, shown, outputs, matching, filtering, inputs, preserved)
    return JoinStreamPlan(
        name=name,
        columns=columns,
        event_time=event_time,
        inputs=planned_inputs,
        links=links,
        term_queries=tuple(
            _spark_query(outputs, conjuncts, inputs, schema, k).sql("spark")
            for k in range(len(inputs))
        ),
        history_statement=_history(name, outputs, conjuncts, inputs),
        create_statements=(
            create_table(
                archive,
                [column_def(c.name, c.type) for c in columns]
                + [column_def(naming.RUN_COLUMN, "bigint", not_null=True)],
            ),
            create_index(
                naming.join_archive_index(name, "time"),
                archive,
                [exp.column(event_time, quoted=True)],
            ),
            create_index(
                naming.join_archive_index(name, "runs"),
                archive,
                [exp.column(naming.RUN_COLUMN, quoted=True)],
                using="brin",
            ),
            *_probe_indexes(planned_inputs, links),
            create_view(name, view),
        ),
        drop_statements=(
            drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),
            drop("TABLE", archive),
        ),
        view_query=view.sql("postgres"),
        preserved=preserved,
        event_time_input=time_input,
        event_time_column=time_column,
    )


# ---- inputs --------------------------------------------------------------------------------


def _inputs(select: exp.Select, streams: Mapping[str, StreamPlan]) -> list[_Input]:
    from_ = select.args.get("from_")
    items = [from_.this if from_ is not None else None]
    for join in select.args.get("joins") or []:
        _check_join_kind(join)
        items.append(join.this)
    inputs: list[_Input] = []
    for item in items:
        entry = _input(item, streams)
        if any(e.alias == entry.alias for e in inputs):
            raise UnsupportedSQL(
                f"{entry.alias!r} names two inputs of the join; give each its own alias, e.g. "
                f"FROM {entry.source.name} a1 JOIN {entry.source.name} a2 ON ..."
            )
        inputs.append(entry)
    return inputs


def _check_join_kind(join: exp.Join) -> None:
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if kind in ("SEMI", "ANTI") or (kind == "OUTER" and not side):
        shown = " ".join(p for p in (side, kind, "JOIN") if p)
        raise UnsupportedSQL(
            f"{shown} is not supported yet; use an inner JOIN, or LEFT/RIGHT/FULL JOIN of "
            "two streams"
        )
    if join.args.get("using"):
        columns = ", ".join(c.name for c in join.args["using"])
        raise UnsupportedSQL(
            f"JOIN ... USING ({columns}) is not supported; write the equality out, e.g. "
            "JOIN b ON a.k = b.k"
        )
    if join.args.get("method") or join.args.get("global_"):
        raise UnsupportedSQL(f"{join.sql('postgres')!r}: use a plain inner JOIN")


def _input(item: exp.Expr | None, streams: Mapping[str, StreamPlan]) -> _Input:
    if not isinstance(item, exp.Table):
        shown = item.sql("postgres") if item is not None else "nothing"
        raise UnsupportedSQL(
            f"a join reads raw streams or TUMBLE(...) windows of them, not {shown!r}"
        )
    if item.args.get("version") is not None or item.find(exp.Version):
        raise UnsupportedSQL(
            f"FOR SYSTEM_TIME AS OF reads a versioned PostgreSQL table, not the stream "
            f"{item.name!r}: JOIN table FOR SYSTEM_TIME AS OF s.time AS v ON v.key = s.key"
        )
    window_us = None
    call = item.this
    if isinstance(call, exp.Anonymous):
        if call.name.upper() != "TUMBLE":
            raise UnsupportedSQL(
                f"{call.name.upper()} windows are not supported as join inputs; use {WINDOW_FORM}"
            )
        args = list(call.expressions)
        if len(args) != 3 or not all(isinstance(a, exp.Column) for a in args[:2]):
            raise UnsupportedSQL(f"a windowed join input is {WINDOW_FORM} AS alias")
        source_name, time_column = args[0].name, args[1].name
        window_us = parse_interval(args[2])
    elif isinstance(call, exp.Identifier):
        source_name, time_column = call.name, None
    else:
        raise UnsupportedSQL(f"a join reads raw streams, not {item.sql('postgres')!r}")
    source = streams.get(source_name)
    if source is None:
        raise UnknownSource(
            f"{source_name!r} does not exist: it is neither a stream nor a table or view in "
            "PostgreSQL"
        )
    if not isinstance(source, RawStreamPlan):
        raise UnsupportedSQL(
            f"{source_name!r} is a derived stream; joins read raw streams (join them first, "
            "then build streams on the join)"
        )
    if time_column is not None and time_column != source.event_time:
        raise UnsupportedSQL(
            f"TUMBLE windows over the event-time column of {source_name!r}, "
            f"{source.event_time!r}, not {time_column!r}"
        )
    alias = item.alias or source_name
    if window_us is not None and not item.alias:
        raise UnsupportedSQL(f"a windowed join input needs an alias: {WINDOW_FORM} AS w")
    return _Input(alias, source, window_us)


# ---- columns ---------------------------------------------------------------------------


def _qualify(select: exp.Select, inputs: list[_Input]) -> exp.Select:
    """A copy of ``select`` whose columns carry their joined names (alias__column)."""
    copy = select.copy()
    parts: list[exp.Expr] = list(copy.expressions)
    parts += [j.args["on"] for j in copy.args.get("joins") or [] if j.args.get("on")]
    if copy.args.get("where") is not None:
        parts.append(copy.args["where"])
    for part in parts:
        for column in list(part.find_all(exp.Column)):
            if isinstance(column.this, exp.Star):
                continue
            column.replace(exp.column(_joined_name(column, inputs), quoted=True))
    return copy


def _joined_name(column: exp.Column, inputs: list[_Input]) -> str:
    name, alias = column.name, column.table
    if alias:
        entry = next((e for e in inputs if e.alias == alias), None)
        if entry is None:
            known = ", ".join(e.alias for e in inputs)
            raise UnsupportedSQL(f"{alias!r} is not an input of the join (inputs: {known})")
        candidates = [entry]
    else:
        candidates = inputs
    owners = [e for e in candidates if naming.join_column(e.alias, name) in e.schema()]
    if not owners:
        where = f" of {alias!r}" if alias else ""
        raise UnsupportedSQL(f"column {name!r}{where} does not exist in the joined streams")
    if len(owners) > 1:
        choices = " or ".join(f"{e.alias}.{name}" for e in owners)
        raise UnsupportedSQL(f"column {name!r} is ambiguous in the join; write {choices}")
    return naming.join_column(owners[0].alias, name)


def _preserved(select: exp.Select, inputs: int) -> tuple[int, ...]:
    """The inputs an outer join keeps every row of (LEFT: the first, RIGHT: the second,
    FULL: both); outer joins take two inputs."""
    joins = select.args.get("joins") or []
    sides = [(j.args.get("side") or "").upper() for j in joins]
    if not any(sides):
        return ()
    if inputs != 2:
        raise UnsupportedSQL(
            f"{sides[-1] or sides[0]} JOIN is supported between two streams; join the others "
            "with an inner JOIN in a stream of their own first"
        )
    return {"LEFT": (0,), "RIGHT": (1,), "FULL": (0, 1)}[sides[0]]


def _conditions(select: exp.Select) -> tuple[list[exp.Expr], list[exp.Expr]]:
    """The ANDed conditions of every ON (what matches) and of WHERE (what is kept of the
    joined rows, NULL-padded ones of an outer join included)."""
    on = [j.args["on"] for j in select.args.get("joins") or [] if j.args.get("on")]
    where = select.args.get("where")
    return conjuncts(*on), conjuncts(where.this if where is not None else None)


def _outputs(
    original: exp.Select, qualified: exp.Select, inputs: list[_Input]
) -> list[tuple[str, exp.Expr]]:
    outputs: list[tuple[str, exp.Expr]] = []
    for item, renamed in zip(original.expressions, qualified.expressions, strict=True):
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            alias = item.table if isinstance(item, exp.Column) else ""
            chosen = [e for e in inputs if not alias or e.alias == alias]
            if not chosen:
                raise UnsupportedSQL(f"{alias!r} is not an input of the join")
            for entry in chosen:
                for spec in entry.source.columns:
                    joined = naming.join_column(entry.alias, spec.name)
                    outputs.append((spec.name, exp.column(joined, quoted=True)))
            continue
        name = naming.check_column_name(output_name(item), window_names=True)
        expression = renamed.this if isinstance(renamed, exp.Alias) else renamed
        outputs.append((name, expression))
    names = [n for n, _ in outputs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UnsupportedSQL(
            f"the join selects two columns named {', '.join(map(repr, twice))}; name them "
            "apart with AS, e.g. SELECT a.id AS auction_id, b.id AS bid_id"
        )
    return outputs


def _event_time(
    outputs: list[tuple[str, exp.Expr]], inputs: list[_Input], preserved: tuple[int, ...]
) -> tuple[str, int, str]:
    """(output column, input position, the input's column) of the join's event time: the
    first selected column that is an input's event time or window bound; for an inner join
    that selects none, the first input's event time, archived as naming.HIDDEN_EVENT_TIME
    and not shown (Nexmark q3)."""
    times: dict[str, tuple[int, str]] = {}
    for position, entry in enumerate(inputs):
        columns = [entry.source.event_time]
        if entry.window_us is not None:
            columns += [naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN]
        for column in columns:
            times[naming.join_column(entry.alias, column)] = (position, column)
    for name, expression in outputs:
        if isinstance(expression, exp.Column) and expression.name in times:
            return (name, *times[expression.name])
    if not preserved:
        return naming.HIDDEN_EVENT_TIME, 0, inputs[0].source.event_time
    raise UnsupportedSQL(
        "an outer join stream keeps the event time of its preserved input, so that windows "
        "can be built on it: select the event-time column of one input (e.g. a.t) or the "
        "window_start of a windowed input"
    )


# ---- probe links -------------------------------------------------------------------------


def _owner_set(node: exp.Expr, owners: dict[str, int]) -> set[int]:
    return {owners[c.name] for c in node.find_all(exp.Column) if c.name in owners}


def _input_filter(
    conjuncts: list[exp.Expr], position: int, entry: _Input, owners: dict[str, int]
) -> str | None:
    """The conjuncts on input ``position``'s raw columns alone, in PostgreSQL over the raw
    archive (window columns are computed, so conditions on them stay in Spark)."""
    prefix = naming.join_column(entry.alias, "")
    window_columns = {
        naming.join_column(entry.alias, naming.WINDOW_START_COLUMN),
        naming.join_column(entry.alias, naming.WINDOW_END_COLUMN),
    }
    own = []
    for conjunct in conjuncts:
        columns = list(conjunct.find_all(exp.Column))
        if not columns or _owner_set(conjunct, owners) != {position}:
            continue
        if any(c.name in window_columns for c in columns):
            continue
        raw = conjunct.copy()
        for column in list(raw.find_all(exp.Column)):
            column.replace(exp.column(column.name[len(prefix) :], quoted=True))
        own.append(raw)
    if not own:
        return None
    return exp.and_(*own).sql("postgres")


def _links(conjunct: exp.Expr, inputs: list[_Input], owners: dict[str, int]) -> list[ProbeLink]:
    if isinstance(conjunct, exp.Between):
        low = exp.GTE(this=conjunct.this.copy(), expression=conjunct.args["low"].copy())
        high = exp.LTE(this=conjunct.this.copy(), expression=conjunct.args["high"].copy())
        return _links(low, inputs, owners) + _links(high, inputs, owners)
    comparisons: dict[type[exp.Expr], str] = {
        exp.EQ: "=",
        exp.GTE: ">=",
        exp.GT: ">",
        exp.LTE: "<=",
        exp.LT: "<",
    }
    operator = comparisons.get(type(conjunct))
    if operator is None:
        return []
    left = _side(conjunct.this, owners)
    right = _side(conjunct.expression, owners)
    if left is None or right is None or left[0] == right[0]:
        return []
    mirrored = {"=": "=", ">=": "<=", ">": "<", "<=": ">=", "<": ">"}
    return [
        link
        for target, bound, op in ((left, right, operator), (right, left, mirrored[operator]))
        for link in _link(target, bound, op, inputs)
    ]


def _side(node: exp.Expr, owners: dict[str, int]) -> tuple[int, str, int] | None:
    """(input, joined column, offset µs) of ``column`` or ``column ± INTERVAL``."""
    node = node.unnest()
    offset = 0
    if isinstance(node, exp.Add | exp.Sub) and isinstance(node.expression, exp.Interval):
        shift = parse_interval(node.expression, "interval in a join condition")
        offset = shift if isinstance(node, exp.Add) else -shift
        node = node.this.unnest()
    if not isinstance(node, exp.Column) or node.name not in owners:
        return None
    return owners[node.name], node.name, offset


def _link(
    target: tuple[int, str, int], bound: tuple[int, str, int], op: str, inputs: list[_Input]
) -> list[ProbeLink]:
    """target.column (+ t_off) op bound.column (+ b_off), as a restriction of the target."""
    (t, t_column, t_off), (b, b_column, b_off) = target, bound
    t_entry, b_entry = inputs[t], inputs[b]
    t_raw = _raw_column(t_entry, t_column)
    b_raw = _raw_column(b_entry, b_column)
    window = naming.WINDOW_START_COLUMN
    if t_raw == window and b_raw == window and op == "=" and not (t_off or b_off):
        times = (t_entry.source.event_time, b_entry.source.event_time)
        return [ProbeLink(t, times[0], ProbeKind.SAME_WINDOW, b, times[1])]
    if t_raw is None or b_raw is None or t_raw in _WINDOW_COLUMNS or b_raw in _WINDOW_COLUMNS:
        return []
    offset = b_off - t_off
    if op == "=":
        if offset:
            return []
        return [ProbeLink(t, t_raw, ProbeKind.EQUAL, b, b_raw)]
    kind = ProbeKind.AT_LEAST if op in (">=", ">") else ProbeKind.AT_MOST
    if offset and t_entry.schema()[t_column].name != "timestamptz":
        return []
    return [ProbeLink(t, t_raw, kind, b, b_raw, offset)]


_WINDOW_COLUMNS = (naming.WINDOW_START_COLUMN, naming.WINDOW_END_COLUMN)


def _raw_column(entry: _Input, joined: str) -> str | None:
    prefix = naming.join_column(entry.alias, "")
    return joined[len(prefix) :] if joined.startswith(prefix) else None


def _probe_indexes(inputs: tuple[JoinInput, ...], links: tuple[ProbeLink, ...]) -> list[str]:
    """Indexes on the raw archives for the columns probes look up (kept when the join is
    dropped: another join may use them, and they go with the raw stream)."""
    wanted: dict[tuple[str, str], None] = {}
    for link in links:
        source = inputs[link.target].source
        wanted[(source, link.column)] = None
    return [
        create_index(
            naming.probe_index(source, column),
            table(naming.raw_archive_table(source)),
            [exp.column(column, quoted=True)],
            if_not_exists=True,
        )
        for source, column in wanted
    ]


# ---- the queries ---------------------------------------------------------------------------


def _input_select(entry: _Input, source: exp.Expr, *, spark: bool) -> exp.Select:
    """The input's rows under their joined names, with window columns when windowed."""
    items: list[exp.Expr] = [
        exp.alias_(
            exp.column(c.name, quoted=True), naming.join_column(entry.alias, c.name), quoted=True
        )
        for c in entry.source.columns
    ]
    if entry.window_us is not None:
        time = entry.source.event_time
        start: exp.Expr
        end: exp.Expr
        if spark:
            start = window_start_spark(time, entry.window_us)
            end = exp.func(
                "timestamp_micros",
                exp.Add(
                    this=exp.func("unix_micros", start.copy()),
                    expression=exp.Literal.number(entry.window_us),
                ),
            )
        else:
            start = exp.func(
                "strata_window_start",
                exp.column(time, quoted=True),
                exp.Literal.number(entry.window_us),
            )
            end = exp.Add(
                this=start.copy(),
                expression=exp.Mul(
                    this=exp.Literal.number(entry.window_us),
                    expression=exp.Interval(this=exp.Literal.string("1 microsecond")),
                ),
            )
        items.append(
            exp.alias_(
                start, naming.join_column(entry.alias, naming.WINDOW_START_COLUMN), quoted=True
            )
        )
        items.append(
            exp.alias_(end, naming.join_column(entry.alias, naming.WINDOW_END_COLUMN), quoted=True)
        )
    items.append(exp.column(naming.RUN_COLUMN, quoted=True))
    return exp.select(*items).from_(source)


def _joined_from(inputs: list[_Input], sources: list[exp.Expr], *, spark: bool) -> exp.Select:
    """SELECT ... FROM input_0 AS p0 CROSS JOIN input_1 AS p1 ... (the items come later)."""
    frames = [
        _input_select(entry, source, spark=spark).subquery(naming.join_input_alias(k))
        for k, (entry, source) in enumerate(zip(inputs, sources, strict=True))
    ]
    query = exp.select().from_(frames[0])
    for frame in frames[1:]:
        query = query.join(frame, join_type="CROSS")
    return query


def _spark_query(
    outputs: list[tuple[str, exp.Expr]],
    conjuncts: list[exp.Expr],
    inputs: list[_Input],
    schema: dict[str, SqlType],
    delta: int,
) -> exp.Select:
    """The join over the views of the inputs' rows, each output row attributed to the run of
    input ``delta``'s row (the batch's side in this term of the delta)."""
    sources: list[exp.Expr] = [exp.table_(naming.join_input_view(k)) for k in range(len(inputs))]
    query = _joined_from(inputs, sources, spark=True)
    items = [exp.alias_(to_spark(e, schema), n, quoted=True) for n, e in outputs]
    items.append(
        exp.alias_(
            exp.column(naming.RUN_COLUMN, table=naming.join_input_alias(delta), quoted=True),
            naming.RUN_COLUMN,
            quoted=True,
        )
    )
    query = query.select(*items)
    if conjuncts:
        query = query.where(exp.and_(*(to_spark(c, schema) for c in conjuncts)))
    return query


def _view(
    name: str,
    columns: tuple[ColumnSpec, ...],
    outputs: list[tuple[str, exp.Expr]],
    matching: list[exp.Expr],
    filtering: list[exp.Expr],
    inputs: list[_Input],
    preserved: tuple[int, ...],
) -> exp.Query:
    """The view: the archived rows of the inner join and, for an outer join, the rows of
    each preserved input that nothing matches, padded with NULLs. Those are found on read
    (NOT EXISTS against the other input's archive, in the reader's snapshot): a late match
    removes a padded row at the instant it commits, as in the batch query."""
    archived: exp.Query = exp.select(*(exp.column(c.name, quoted=True) for c in columns)).from_(
        table(naming.join_archive_table(name))
    )
    for kept in preserved:
        archived = exp.union(
            archived,
            _unmatched(columns, outputs, matching, filtering, inputs, kept),
            distinct=False,
        )
    return archived


def _unmatched(
    columns: tuple[ColumnSpec, ...],
    outputs: list[tuple[str, exp.Expr]],
    matching: list[exp.Expr],
    filtering: list[exp.Expr],
    inputs: list[_Input],
    kept: int,
) -> exp.Select:
    """Rows of input ``kept`` that no row of the other input matches, the other input's
    columns NULL. Inside NOT EXISTS the other input's joined names (alias__column) are its
    own; the kept input's resolve to the outer row."""
    other = 1 - kept
    nulls = exp.select(
        *(
            exp.alias_(exp.cast(exp.null(), t.pg()), column, quoted=True)
            for column, t in inputs[other].schema().items()
        )
    )
    frames: list[exp.Expr] = [exp.null(), exp.null()]
    frames[kept] = _input_select(
        inputs[kept], table(naming.raw_archive_table(inputs[kept].source.name)), spark=False
    ).subquery(naming.join_input_alias(kept))
    frames[other] = nulls.subquery(naming.join_input_alias(other))
    match = _input_select(
        inputs[other], table(naming.raw_archive_table(inputs[other].source.name)), spark=False
    ).subquery("strata_match")
    probe = exp.select(exp.Literal.number(1)).from_(match)
    if matching:
        probe = probe.where(exp.and_(*(c.copy() for c in matching)))
    query = (
        exp.select(
            *(
                exp.alias_(exp.cast(e.copy(), c.type.pg()), n, quoted=True)
                for (n, e), c in zip(outputs, columns, strict=True)
            )
        )
        .from_(frames[0])
        .join(frames[1], join_type="CROSS")
        .where(exp.Not(this=exp.Exists(this=probe)))
    )
    if filtering:
        query = query.where(exp.and_(*(c.copy() for c in filtering)))
    return query


def _history(
    name: str,
    outputs: list[tuple[str, exp.Expr]],
    conjuncts: list[exp.Expr],
    inputs: list[_Input],
) -> str:
    """PostgreSQL: archive the join over every row the inputs archived so far; each row is
    attributed to the latest-numbered run among the rows it joins."""
    sources: list[exp.Expr] = [table(naming.raw_archive_table(e.source.name)) for e in inputs]
    query = _joined_from(inputs, sources, spark=False)
    runs = [
        exp.column(naming.RUN_COLUMN, table=naming.join_input_alias(k), quoted=True)
        for k in range(len(inputs))
    ]
    latest = runs[0] if len(runs) == 1 else exp.func("greatest", *runs)
    query = query.select(*(e.copy() for _, e in outputs), latest)
    if conjuncts:
        query = query.where(exp.and_(*(c.copy() for c in conjuncts)))
    columns = [exp.to_identifier(n, quoted=True) for n, _ in outputs]
    columns.append(exp.to_identifier(naming.RUN_COLUMN, quoted=True))
    target = exp.Schema(this=table(naming.join_archive_table(name)), expressions=columns)
    return exp.Insert(this=target, expression=query).sql("postgres")
