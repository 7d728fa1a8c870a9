"""Pass 3j: window functions over one stream's rows, computed on read.

``SELECT auction, price, lag(price) OVER (PARTITION BY auction ORDER BY date_time) FROM bid``
(or over an aggregate stream's consolidated rows: running sums of per-minute counts, the
shape of a cumulating window). A row's value depends on the other rows of its partition,
which a late run changes, so the stream is a view that runs the query as written over the
source stream's view at every read: exact at every instant, and reading costs the query.
Streams are not built on it. (Ranks filtered on the rank are top-N: rewriter.build_top_n.)
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import column_names, output_names
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import OnReadStreamPlan, OutputColumn, RawStreamPlan, StreamPlan
from rewriter.registry import exact_in_postgres


def is_window_query(select: exp.Expr) -> bool:
    """A SELECT over one stream (no join, no subquery) whose items use OVER."""
    if not isinstance(select, exp.Select) or select.args.get("joins"):
        return False
    from_ = select.args.get("from_")
    item = from_.this if from_ is not None else None
    return (
        isinstance(item, exp.Table)
        and isinstance(item.this, exp.Identifier)
        and any(e.find(exp.Window) is not None for e in select.expressions)
    )


def build_window_query(
    name: str, select: exp.Select, streams: Mapping[str, StreamPlan]
) -> OnReadStreamPlan:
    for clause, shown in (("group", "GROUP BY"), ("having", "HAVING")):
        if select.args.get(clause):
            raise UnsupportedSQL(
                f"window functions with {shown} are not supported in one statement: create "
                "the aggregate as a stream, then a stream of window functions over it"
            )
    if any(isinstance(s, exp.Subquery) for s in select.find_all(exp.Subquery)):
        raise UnsupportedSQL("subqueries are not supported beside window functions")
    item = select.args["from_"].this
    source = streams.get(item.name)
    if source is None:
        raise UnknownSource(f"stream {item.name!r} does not exist")
    view = select.copy()
    view.args["from_"].set(
        "this",
        exp.alias_(table(source.name, naming.PUBLIC_SCHEMA), item.alias or source.name, table=True),
    )
    exact = view.transform(exact_in_postgres)
    assert isinstance(exact, exp.Select)
    view = exact
    names = output_names(view, column_names(source))
    return OnReadStreamPlan(
        name=name,
        source=source.name,
        raw_sources=(source.name,) if isinstance(source, RawStreamPlan) else source.raw_sources,
        window=None,
        parallelism_reason=(
            "window functions: a late row changes the values of its partition's rows, so "
            f"they are computed over {source.name!r}'s rows on read"
        ),
        columns=tuple(OutputColumn(n, None) for n in names),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )
