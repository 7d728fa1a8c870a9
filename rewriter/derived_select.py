"""What the SELECT of every derived stream obeys, whichever pass plans it: the clauses it
may use, and the names PostgreSQL gives its columns.
"""

from __future__ import annotations

from sqlglot import exp

from rewriter import naming
from rewriter.errors import UnsupportedSQL
from rewriter.plan import (
    JoinStreamPlan,
    ProjectionStreamPlan,
    StreamPlan,
    WindowedAggregatePlan,
)
from rewriter.positions import position_of

_UNSUPPORTED_CLAUSES = {
    "distinct": "SELECT DISTINCT",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
}


_DEDUP_FORM = (
    "SELECT * FROM (SELECT ..., ROW_NUMBER() OVER (PARTITION BY k ORDER BY t DESC) AS rn "
    "FROM stream) x WHERE rn = 1"
)
_INSTEAD = {
    "order": "a view has no order: order when reading it (SELECT ... FROM stream ORDER BY "
    "...), or keep the first N rows with ORDER BY ... LIMIT N over a stream",
    "distinct": "group the rows instead (GROUP BY every selected column)",
}


def check_clauses(select: exp.Select) -> None:
    """Refuse the clauses and constructs no derived stream supports."""
    for clause, shown in _UNSUPPORTED_CLAUSES.items():
        if select.args.get(clause):
            instead = _INSTEAD.get(clause)
            raise UnsupportedSQL(
                f"{shown} is not supported in a derived stream"
                + (f"; {instead}" if instead else "")
            )
    for node in select.find_all(exp.Subquery, exp.Window):
        raise UnsupportedSQL(_refusal(node))


def _refusal(node: exp.Expr) -> str:
    shown = node.sql("postgres")
    if isinstance(node, exp.Window):
        return (
            f"the window function {shown!r} is not supported here; window functions (OVER) "
            "are computed on read over one stream's rows (SELECT ..., lag(x) OVER (...) FROM "
            f"stream), and ranks filtered on the rank are top-N ({_DEDUP_FORM})"
        )
    parent = node.parent
    if isinstance(node, exp.Exists) and isinstance(parent, exp.Not):
        return (
            f"NOT EXISTS (subquery) is not supported here: {shown!r}; NOT EXISTS is an "
            "anti-join as a condition of WHERE, alone or ANDed, correlated by equalities (... "
            "WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)), beside no window call; else "
            "keep the rows without a match with a LEFT JOIN of the keys: ... FROM a LEFT JOIN "
            "(SELECT k FROM b GROUP BY k) x ON a.k = x.k WHERE x.k IS NULL"
        )
    if isinstance(node, exp.Exists):
        return (
            f"EXISTS (subquery) is not supported here: {shown!r}; EXISTS is a semi-join as a "
            "condition of WHERE, alone or ANDed, correlated by equalities (... WHERE EXISTS "
            "(SELECT 1 FROM b WHERE b.k = a.k)), beside no window call; else join the keys "
            "(... FROM a JOIN (SELECT k FROM b GROUP BY k) x ON a.k = x.k)"
        )
    if isinstance(node, exp.Subquery) and isinstance(parent, exp.From | exp.Join):
        return (
            f"a subquery as a join input is not supported: {shown!r}; create it as a stream "
            "(CREATE STREAM name AS ...) and join that stream"
        )
    if isinstance(parent, exp.In) and isinstance(parent.parent, exp.Not):
        return (
            f"NOT IN (subquery) is not supported here: {shown!r}; NOT IN is an anti-join as "
            "a condition of WHERE, alone or ANDed, its subquery not correlated or "
            "correlated only by equalities of its WHERE, beside no window call; else keep "
            "the rows without a match with NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)"
        )
    if isinstance(parent, exp.In):
        return (
            f"IN (subquery) is not supported here: {shown!r}; IN is a semi-join as a "
            "condition of WHERE, alone or ANDed, its subquery not correlated or correlated "
            "only by equalities of its WHERE, beside no window call; else join the values "
            "(... FROM a JOIN (SELECT k FROM b GROUP BY k) x ON a.k = x.k)"
        )
    return (
        f"a subquery inside an expression is not supported here: {shown!r}; a scalar "
        "subquery is one aggregate without GROUP BY, HAVING or LIMIT, beside no window call, "
        "not correlated or correlated only by equalities of its WHERE (... WHERE price > "
        "(SELECT avg(price) FROM s s2 WHERE s2.k = s1.k)), and in a query that aggregates "
        "without GROUP BY it stands inside an aggregate call or WHERE; else join the "
        "stream, or compute the value in a stream of its own"
    )


def check_statement(query: exp.Expr, *, nested: bool = False) -> None:
    """Refuse, by name, what no kind of derived stream supports, before any pass reads the
    statement (a pass would otherwise fail on it with a message about something else).
    ``nested``: ``query`` is a subquery of the statement, or a branch of its UNION."""
    if isinstance(query, exp.Union):
        check_statement(query.this, nested=True)
        check_statement(query.expression, nested=True)
        return
    if not isinstance(query, exp.Select):
        return
    for exists in query.find_all(exp.Exists):
        raise UnsupportedSQL(_refusal(exists), position=position_of(exists))
    group = query.args.get("group")
    for key in group.expressions if group is not None else []:
        if isinstance(key, exp.GroupingSets | exp.Rollup | exp.Cube):
            kind = {exp.GroupingSets: "GROUPING SETS", exp.Rollup: "ROLLUP"}.get(type(key), "CUBE")
            raise UnsupportedSQL(
                f"{kind} is not supported here: it is in the GROUP BY of a stream's query, "
                "of a subquery or of a branch of UNION ALL, without WINDOW clauses"
            )
    distinct = query.args.get("distinct")
    if distinct is not None and distinct.args.get("on") is not None:
        _check_distinct_on(query, distinct.args["on"], nested)
    if query.args.get("limit") is not None and query.args.get("order") is None:
        raise UnsupportedSQL(
            "LIMIT without ORDER BY keeps arbitrary rows, which differ from read to read; "
            "say which rows with ORDER BY ... LIMIT N"
        )
    from_ = query.args.get("from_")
    item = from_.this if from_ is not None else None
    joined = [join.this for join in query.args.get("joins") or []]
    for input_ in [item, *joined]:
        if isinstance(input_, exp.Lateral):
            raise UnsupportedSQL(
                f"a LATERAL subquery is not supported: {input_.sql('postgres')!r}; it is "
                "computed per row of the inputs before it: join a subquery that groups by the "
                "key instead (... JOIN (SELECT k, max(x) AS m FROM s GROUP BY k) q ON q.k = "
                "i.k)"
            )
        # A subquery in FROM, joined or not, is a stream of its own (split_subquery,
        # split_join_inputs): it obeys what every derived stream does.
        if isinstance(input_, exp.Subquery):
            if not isinstance(input_.this, exp.Select | exp.Union):
                raise UnsupportedSQL(_refusal(input_))
            check_statement(input_.this, nested=True)


_DISTINCT_ON_FORM = (
    "SELECT DISTINCT ON (k) k, x, t FROM stream ORDER BY k, t DESC (or FROM TUMBLE(stream, t, "
    "INTERVAL '...') w)"
)


def _check_distinct_on(select: exp.Select, on: exp.Expr, nested: bool) -> None:
    """DISTINCT ON is a stream's own SELECT over one stream's rows (a top-N, ranked on read:
    rewriter.build_top_n), its first ORDER BY expressions the DISTINCT ON ones, as
    PostgreSQL requires, and its ORDER BY saying which row of each key is kept."""
    if nested:
        raise UnsupportedSQL(
            "DISTINCT ON is supported as a stream's own SELECT, not in a subquery or a UNION: "
            f"create it as a stream of its own ({_DISTINCT_ON_FORM}) and read that stream"
        )
    if (
        select.args.get("joins")
        or select.args.get("group")
        or not isinstance(
            select.args["from_"].this if select.args.get("from_") else None, exp.Table
        )
    ):
        raise UnsupportedSQL(
            "DISTINCT ON keeps one row per key of one stream's rows: join or aggregate in a "
            f"stream of its own first, then keep its rows with {_DISTINCT_ON_FORM}"
        )
    order = select.args.get("order")
    if order is None:
        raise UnsupportedSQL(
            "DISTINCT ON without ORDER BY keeps an arbitrary row per key, which differs from "
            f"read to read; say which with ORDER BY: {_DISTINCT_ON_FORM}"
        )
    keys = {_resolved(select, e) for e in (on.expressions if isinstance(on, exp.Tuple) else [on])}
    # PostgreSQL's rule: the leading ORDER BY items are DISTINCT ON ones, until those run out.
    leading = [_resolved(select, o.this) for o in order.expressions[: len(keys)]]
    if not keys.issuperset(leading):
        raise UnsupportedSQL(
            "SELECT DISTINCT ON expressions must match initial ORDER BY expressions (as in "
            f"PostgreSQL): {_DISTINCT_ON_FORM}"
        )


def positional_item(select: exp.Select, key: exp.Expr) -> exp.Expr | None:
    """The select item (unaliased) that ``key``, a GROUP BY, ORDER BY or DISTINCT ON item,
    names by its position (``GROUP BY 1``); None when ``key`` is no position of an item."""
    items = select.expressions
    if isinstance(key, exp.Literal) and key.is_int and 1 <= int(key.name) <= len(items):
        return items[int(key.name) - 1].unalias()
    return None


def _resolved(select: exp.Select, expression: exp.Expr) -> str:
    """An ORDER BY or DISTINCT ON expression as PostgreSQL reads it: a position or a select
    item's name stands for that item; table qualifiers dropped, to compare."""
    items = select.expressions
    by_position = positional_item(select, expression)
    if by_position is not None:
        expression = by_position
    elif isinstance(expression, exp.Column) and not expression.table:
        named = [i for i in items if isinstance(i, exp.Alias) and i.alias == expression.name]
        if named:
            expression = named[0]
    bare = expression.unalias().copy()
    for column in bare.find_all(exp.Column):
        column.set("table", None)
    return bare.sql("postgres")


def output_name(item: exp.Expr) -> str:
    """The column name PostgreSQL gives ``item`` in a SELECT list; an expression it would
    call "?column?" must be named with AS."""
    name, _ = _figured(item)
    if name is None:
        raise UnsupportedSQL(f"give the expression {item.sql('postgres')!r} a name with AS")
    return name


def named_query(query: exp.Expr) -> exp.Expr:
    """``query`` (a SELECT, or a UNION of them) with every item named as PostgreSQL names
    it (``count(*) AS count``), so that the SQL generated from it keeps the column names of
    the text it was parsed from (sqlglot writes ``ceiling`` as ``CEIL``)."""
    if isinstance(query, exp.Union):
        union = query.copy()
        union.set("this", named_query(query.this))
        union.set("expression", named_query(query.expression))
        return union
    if not isinstance(query, exp.Select):
        return query.copy()
    named = query.copy()
    named.set(
        "expressions",
        [
            item
            if isinstance(item, exp.Alias | exp.Star) or _is_star(item)
            else exp.alias_(item, output_name(item), quoted=True)
            for item in named.expressions
        ],
    )
    return named


def _is_star(item: exp.Expr) -> bool:
    return isinstance(item, exp.Column) and isinstance(item.this, exp.Star)


_RENAMED = {
    "variance_pop": "var_pop",
    "logical_or": "bool_or",
    "approx_distinct": "approx_count_distinct",
}
_FOLDED_NAMES = {"variance", "logical_and"}
# PostgreSQL's names (FigureColname) of what sqlglot parses into nodes of other names.
_SPECIAL_NAMES: dict[type[exp.Expr], str] = {
    exp.AtTimeZone: "timezone",
    exp.Extract: "extract",
    exp.StrPosition: "position",
    exp.Substring: "substring",
    exp.Coalesce: "coalesce",
    exp.Greatest: "greatest",
    exp.Least: "least",
    exp.Nullif: "nullif",
}
_TRIMS = {"LEADING": "ltrim", "TRAILING": "rtrim"}
# The names PostgreSQL's grammar gives the types a cast names (int -> int4, ...).
_TYPE_NAMES = {
    "INT": "int4",
    "BIGINT": "int8",
    "SMALLINT": "int2",
    "DOUBLE": "float8",
    "FLOAT": "float4",
    "BOOLEAN": "bool",
    "DECIMAL": "numeric",
    "TIMESTAMPTZ": "timestamptz",
}


def _figured(node: exp.Expr) -> tuple[str | None, int]:
    """PostgreSQL's FigureColnameInternal: a name and its strength (2: a column's or a
    function's, 1: a fallback such as a cast's type, 0: none)."""
    if isinstance(node, exp.Alias):
        return node.alias, 2
    if isinstance(node, exp.Column):
        return (None, 0) if isinstance(node.this, exp.Star) else (node.name, 2)
    if isinstance(node, exp.Paren | exp.Bracket):
        return _figured(node.this)
    if isinstance(node, exp.Cast):
        name, strength = _figured(node.this)
        if strength == 2:
            return name, 2
        kind = node.to.this.name if isinstance(node.to.this, exp.DataType.Type) else ""
        return _TYPE_NAMES.get(kind, kind.lower() or None), 1
    if isinstance(node, exp.Case):
        default = node.args.get("default")
        name, strength = _figured(default) if default is not None else (None, 0)
        return (name, 2) if strength == 2 else ("case", 1)
    if isinstance(node, exp.Anonymous):
        return node.name.lower(), 2
    written = node.meta_get("written")  # a call's name as written (rewriter.positions)
    if written:
        return str(written).lower(), 2
    if isinstance(node, exp.Trim):
        return _TRIMS.get(str(node.args.get("position") or "").upper(), "btrim"), 2
    special = next((n for cls, n in _SPECIAL_NAMES.items() if isinstance(node, cls)), None)
    if special is not None:
        return special, 2
    if not isinstance(node, exp.Func):
        return None, 0
    # A call built by a pass or read from generated SQL: sqlglot's name for it, where it is
    # PostgreSQL's (it folds variance and var_samp, bool_and and every together).
    name = node.sql_name().lower()
    if name in _FOLDED_NAMES:
        return None, 0
    return _RENAMED.get(name, name), 2


def column_names(plan: StreamPlan) -> list[str]:
    """The columns of a stream's view, in order."""
    if isinstance(plan, WindowedAggregatePlan):
        return [o.name for o in plan.outputs]
    if isinstance(plan, ProjectionStreamPlan | JoinStreamPlan):
        return [c.name for c in plan.shown]
    return [c.name for c in plan.columns]


def is_star(item: exp.Expr) -> bool:
    """Whether a select item is ``*`` or ``x.*``."""
    return isinstance(item, exp.Star) or (
        isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
    )


def output_names(select: exp.Select, star: list[str]) -> list[str]:
    """The names of ``select``'s columns, a ``*`` (or ``x.*``) standing for ``star``."""
    names: list[str] = []
    for item in select.expressions:
        if is_star(item):
            names += star
        else:
            names.append(output_name(item))
    return names


def check_shown_time(source: str, time_column: str, what: str) -> None:
    """``what`` reads ``source``'s view by its event time: refused when ``source`` keeps
    its event time out of its view (it does not select it)."""
    if time_column == naming.HIDDEN_EVENT_TIME:
        raise UnsupportedSQL(
            f"{what} reads the event time of {source!r} from its view, and {source!r} does "
            "not select its source's event-time column: select it in that stream, then "
            "build on it"
        )
