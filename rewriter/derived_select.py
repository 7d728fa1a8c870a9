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

_UNSUPPORTED_CLAUSES = {
    "distinct": "SELECT DISTINCT",
    "order": "ORDER BY",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "with_": "WITH (common table expressions)",
    "windows": "WINDOW",
    "qualify": "QUALIFY",
}


def check_clauses(select: exp.Select) -> None:
    """Refuse the clauses and constructs no derived stream supports."""
    for clause, shown in _UNSUPPORTED_CLAUSES.items():
        if select.args.get(clause):
            raise UnsupportedSQL(f"{shown} is not supported in a derived stream")
    for node in select.find_all(exp.Subquery, exp.Window):
        kind = "subqueries" if isinstance(node, exp.Subquery) else "window functions (OVER)"
        raise UnsupportedSQL(f"{kind} are not supported yet: {node.sql('postgres')!r}")


def output_name(item: exp.Expr) -> str:
    if isinstance(item, exp.Alias):
        return item.alias
    if isinstance(item, exp.Column):
        return item.name
    if isinstance(item, exp.Func) and not isinstance(item, exp.Anonymous):
        # PostgreSQL names an unaliased call after its function, e.g. count(*) -> "count".
        # sqlglot folds some spellings together (variance and var_samp; bool_and and every):
        # those cannot be named back and need an alias.
        name = item.sql_name().lower()
        if name not in _FOLDED_NAMES:
            return _RENAMED.get(name, name)
    raise UnsupportedSQL(f"give the expression {item.sql('postgres')!r} a name with AS")


_RENAMED = {
    "variance_pop": "var_pop",
    "logical_or": "bool_or",
    "approx_distinct": "approx_count_distinct",
}
_FOLDED_NAMES = {"variance", "logical_and"}


def column_names(plan: StreamPlan) -> list[str]:
    """The columns of a stream's view, in order."""
    if isinstance(plan, WindowedAggregatePlan):
        return [o.name for o in plan.outputs]
    if isinstance(plan, ProjectionStreamPlan | JoinStreamPlan):
        return [c.name for c in plan.shown]
    return [c.name for c in plan.columns]


def output_names(select: exp.Select, star: list[str]) -> list[str]:
    """The names of ``select``'s columns, a ``*`` (or ``x.*``) standing for ``star``."""
    names: list[str] = []
    for item in select.expressions:
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
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
