"""Pass 3g: a top-N whose ranked rows are not one stream's rows, split so that they are.

The top-N pass (rewriter.build_top_n) ranks the rows of one stream on read. When the
ranking subquery ranks something else, those rows become the stream ``<name>__inner``,
built like any stream (the server creates it first, in the same transaction), and the
ranking reads it:

* the ranking reads a subquery in FROM (Nexmark q5: the auctions ranked by their count of
  bids per window, ``FROM (SELECT auction, count(*) AS num, ... GROUP BY ...) c``): the
  subquery is the inner stream, read under the same alias;
* the ranking joins or aggregates itself (Nexmark q9: each auction's bids, joined in the
  ranking subquery, ranked by price): the ranking subquery without its rank items is the
  inner stream (a join or an aggregate stream), and the ranking reads it by its column
  names, so every PARTITION BY and ORDER BY expression must be one of its select items.
  A ``*`` or ``a.*`` among them (q9 as Nexmark writes it, ``SELECT A.*, B.auction, ...``)
  stands for the columns of the streams it names, in FROM order, each written out as
  ``a.column``, so the ranking can partition and order by them.

Either way the ranked rows are a stream's consolidated rows, which a late run changes, and
the rank is computed on read over them: exact at every instant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from rewriter import naming
from rewriter.derived_select import column_names, named_query, output_names
from rewriter.errors import UnsupportedSQL
from rewriter.plan import StreamPlan


@dataclass(frozen=True)
class TopNSplit:
    """The inner stream (name and CREATE STREAM) and the top-N statement that ranks it."""

    inner: str
    inner_statement: str
    select: exp.Select


def split_top_n(
    name: str, select: exp.Select, streams: Mapping[str, StreamPlan] | None = None
) -> TopNSplit | None:
    """None when the ranking subquery already ranks one stream's rows (or there is none).
    ``streams`` give the columns a ``*`` in a ranking over a join stands for."""
    from_ = select.args.get("from_")
    subquery = from_.this if from_ is not None else None
    if not isinstance(subquery, exp.Subquery) or not isinstance(subquery.this, exp.Select):
        return None
    ranked = subquery.this
    ranked_from = ranked.args.get("from_")
    item = ranked_from.this if ranked_from is not None else None
    inner = naming.inner_stream(name)
    if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select | exp.Union):
        _check_length(inner)
        statement = f"CREATE STREAM {inner} AS {named_query(item.this).sql('postgres')}"
        top = select.copy()
        top_ranked = top.args["from_"].this.this
        top_ranked.args["from_"].set(
            "this", exp.alias_(exp.to_table(inner), item.alias or inner, table=True)
        )
        return TopNSplit(inner, statement, top)
    if not (ranked.args.get("joins") or ranked.args.get("group")):
        return None
    _check_length(inner)
    return _rank_over_rows(inner, select, _stars_written_out(ranked, streams or {}))


def _stars_written_out(ranked: exp.Select, streams: Mapping[str, StreamPlan]) -> exp.Select:
    """``ranked`` with each ``*`` and ``alias.*`` among its items replaced by the columns of
    the streams it stands for (FROM and JOIN order), as ``alias.column``; unchanged where
    an input is not a stream by name."""
    items = ranked.expressions
    if not any(_is_star(item) for item in items):
        return ranked
    inputs: list[tuple[str, str]] = []  # (alias, stream)
    for source in [ranked.args["from_"].this, *(j.this for j in ranked.args.get("joins") or [])]:
        if not isinstance(source, exp.Table) or source.name not in streams:
            return ranked  # refused below with the star
        inputs.append((source.alias_or_name, source.name))
    written: list[exp.Expr] = []
    for item in items:
        if not _is_star(item):
            written.append(item)
            continue
        alias = item.table if isinstance(item, exp.Column) else ""
        chosen = [(a, s) for a, s in inputs if not alias or a == alias]
        if not chosen:
            raise UnsupportedSQL(f"{alias}.* names no input of the ranking's join")
        written += [
            exp.column(column, table=a) for a, s in chosen for column in column_names(streams[s])
        ]
    expanded = ranked.copy()
    expanded.set("expressions", written)
    return expanded


def _is_star(item: exp.Expr) -> bool:
    return isinstance(item, exp.Star) or (isinstance(item, exp.Column) and item.is_star)


def _rank_over_rows(inner: str, select: exp.Select, ranked: exp.Select) -> TopNSplit:
    """The ranking subquery's rows (its items but the ranks) as the inner stream, ranked by
    the names of those items."""
    rows = ranked.copy()
    ranks = [item for item in rows.expressions if item.find(exp.Window) is not None]
    kept = [item for item in rows.expressions if item.find(exp.Window) is None]
    if any(_is_star(item) for item in kept):
        raise UnsupportedSQL(
            "a ranking over an aggregate, or over a join of inputs that are not streams, "
            "names the columns it ranks: SELECT * is not supported there; list them, as in "
            "SELECT b.auction, b.price, ROW_NUMBER() OVER (...)"
        )
    rows.set("expressions", kept)
    names = output_names(rows, [])
    by_expression = {item.unalias().sql("postgres"): n for item, n in zip(kept, names, strict=True)}

    def to_name(node: exp.Expr) -> exp.Expr:
        shown = node.sql("postgres")
        if shown in by_expression:
            return exp.column(by_expression[shown])
        if isinstance(node, exp.Column) and node.name in names and not node.table:
            return node
        raise UnsupportedSQL(
            f"the ranking orders or partitions by {shown!r}, which is not one of its select "
            "items: select it (with an alias) and rank by that"
        )

    top = select.copy()
    top_ranked = top.args["from_"].this.this
    rank_items = []
    for item in ranks:
        window = item.find(exp.Window)
        assert window is not None
        spec = window.copy()
        spec.set("partition_by", [to_name(p) for p in spec.args.get("partition_by") or []])
        order = spec.args.get("order")
        if order is not None:
            for ordered in order.expressions:
                ordered.set("this", to_name(ordered.this))
        renamed = item.copy()
        found = renamed.find(exp.Window)
        assert found is not None and found is not renamed
        found.replace(spec)
        rank_items.append(renamed)
    top_ranked.set("expressions", [exp.column(n) for n in names] + rank_items)
    for clause in ("joins", "where", "group", "having"):
        top_ranked.set(clause, None)
    top_ranked.set("from_", exp.From(this=exp.to_table(inner)))
    return TopNSplit(inner, f"CREATE STREAM {inner} AS {named_query(rows).sql('postgres')}", top)


def _check_length(inner: str) -> None:
    if len(inner) > naming.MAX_STREAM_NAME:
        raise UnsupportedSQL(
            f"this top-N keeps the rows it ranks as the stream {inner!r}, longer than "
            f"{naming.MAX_STREAM_NAME} characters: choose a shorter name"
        )
