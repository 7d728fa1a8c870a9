"""Pass 3i: a subquery in FROM, planned as a stream of its own (Nexmark q4: the average over
categories of each auction's winning bid).

``SELECT ... FROM (inner) q ...`` is the stream ``<name>__inner`` for ``inner`` - planned
like any stream, parallel where it can be (an aggregate over a join: partials per run) -
and the outer query over that stream's view. The outer query runs as written in PostgreSQL
on read (approximate aggregates as their exact twins): its input is the inner stream's
consolidated rows, which change when a late run changes them, so it is exact at every
instant; reading it costs the outer query over the inner stream's rows. Streams are not
built on it.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlglot import exp

from rewriter import naming
from rewriter.ddl import create_view, drop, table
from rewriter.derived_select import column_names, named_query, output_names
from rewriter.errors import UnknownSource, UnsupportedSQL
from rewriter.plan import (
    OnReadStreamPlan,
    OutputColumn,
    RawStreamPlan,
    StreamPlan,
)
from rewriter.registry import exact_in_postgres


def is_subquery(select: exp.Expr) -> bool:
    if not isinstance(select, exp.Select):
        return False
    from_ = select.args.get("from_")
    item = from_.this if from_ is not None else None
    return isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select | exp.Union)


def inner_statement(name: str, select: exp.Select) -> tuple[str, str]:
    """(name, CREATE STREAM) of the stream the subquery in FROM becomes."""
    inner = naming.inner_stream(name)
    if len(inner) > naming.MAX_STREAM_NAME:
        raise UnsupportedSQL(
            f"a query over a subquery keeps the subquery as the stream {inner!r}, longer than "
            f"{naming.MAX_STREAM_NAME} characters: choose a shorter name"
        )
    subquery = select.args["from_"].this
    return inner, f"CREATE STREAM {inner} AS {named_query(subquery.this).sql('postgres')}"


def build_subquery(
    name: str, select: exp.Select, streams: Mapping[str, StreamPlan]
) -> OnReadStreamPlan:
    inner_name, _ = inner_statement(name, select)
    inner = streams.get(inner_name)
    if inner is None:
        raise UnknownSource(
            f"the stream {inner_name!r} that {name!r} reads does not exist (the server creates "
            "it with the stream)"
        )
    if select.args.get("joins"):
        raise UnsupportedSQL(
            "a query over a subquery reads the subquery alone: create the join as a stream "
            "and select from it"
        )
    subquery = select.args["from_"].this
    alias = subquery.alias or inner_name
    outer = select.copy()
    outer.args["from_"].set(
        "this", exp.alias_(table(inner_name, naming.PUBLIC_SCHEMA), alias, table=True)
    )
    if any(isinstance(s, exp.Subquery) for s in outer.find_all(exp.Subquery)):
        raise UnsupportedSQL("only one subquery, in FROM, is supported in a stream")
    view = outer.transform(exact_in_postgres)
    assert isinstance(view, exp.Select)
    names = output_names(view, column_names(inner))
    return OnReadStreamPlan(
        name=name,
        source=inner_name,
        raw_sources=(inner.name,) if isinstance(inner, RawStreamPlan) else inner.raw_sources,
        window=None,
        parallelism_reason=(
            f"a query over the stream {inner_name!r} (its subquery): run as written over that "
            "stream's rows on read"
        ),
        columns=tuple(OutputColumn(n, None) for n in names),
        create_statements=(create_view(name, view),),
        drop_statements=(drop("VIEW", table(name, naming.PUBLIC_SCHEMA)),),
        view_query=view.sql("postgres"),
    )
