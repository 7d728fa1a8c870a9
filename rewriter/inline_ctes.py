"""Pass 1b: WITH's common table expressions, each inlined where it is read as the subquery it
names (``WITH hot AS (SELECT ...) SELECT ... FROM hot JOIN ...`` is ``SELECT ... FROM (SELECT
...) AS hot JOIN ...``), so that the passes that plan subqueries in FROM and subqueries as
join inputs plan it.

A query over a common table expression equals that query over the expression's body written
in its place: PostgreSQL computes a non-recursive, read-only WITH query once and reads it
where named, which gives the same rows as inlining (the MATERIALIZED hint changes only the
plan). Scopes follow SQL's: a name binds to the nearest WITH that defines it, and a common
table expression sees those defined before it in its list. A window call reads a stream, so
an expression it reads (``FROM TUMBLE(recent, t, ...)``) becomes a stream made with this one,
``<name>__with<k>``, as a subquery in FROM does. What inlining cannot express is refused by
name: WITH RECURSIVE, a data-modifying WITH, and a column list longer than its query's
columns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlglot import exp

from rewriter import naming
from rewriter.derived_select import named_query
from rewriter.errors import UnsupportedSQL
from rewriter.flink_syntax import WINDOW_FUNCTIONS
from rewriter.positions import position_of


@dataclass(frozen=True)
class Inlined:
    """A query with its common table expressions inlined, and the streams made with it for
    those a window call reads: (name, CREATE STREAM), in the order they are created."""

    query: exp.Expr
    companions: tuple[tuple[str, str], ...] = ()
    # Their queries as parsed (positions kept): where rewriter.rename finds what they read.
    bodies: tuple[exp.Query, ...] = ()


def inline_ctes(query: exp.Expr, stream: str) -> Inlined:
    """``query`` (of the stream ``stream``) with every common table expression inlined
    where it is read (the same tree when it has none)."""
    if next(query.find_all(exp.With), None) is None:
        return Inlined(query)
    query = query.copy()
    made = _Made(stream)
    # The deepest WITH first: a nested WITH binds its names before an enclosing one sees
    # the references left in its query (breadth-first order, reversed).
    for with_ in reversed(list(query.find_all(exp.With))):
        owner = with_.parent
        assert owner is not None
        scope = _scope(with_, made)
        owner.set("with_", None)
        scope.substitute(owner)
    return Inlined(query, tuple(made.statements.values()), tuple(made.bodies))


class _Made:
    """The streams made for the common table expressions window calls read, by body."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.statements: dict[str, tuple[str, str]] = {}  # query -> (name, CREATE STREAM)
        self.bodies: list[exp.Query] = []

    def stream_of(self, body: exp.Query, at: exp.Expr) -> str:
        text = named_query(body).sql("postgres")
        if text not in self.statements:
            name = naming.with_stream(self.stream, len(self.statements) + 1)
            if len(name) > naming.MAX_STREAM_NAME:
                raise UnsupportedSQL(
                    f"a common table expression read by a window call is kept as the stream "
                    f"{name!r}, longer than {naming.MAX_STREAM_NAME} characters: choose a "
                    "shorter name",
                    position=position_of(at),
                )
            self.statements[text] = (name, f"CREATE STREAM {name} AS {text}")
            self.bodies.append(body)
        return self.statements[text][0]


@dataclass
class _Scope:
    """The common table expressions of one WITH: each body as written (its references to
    those before it left as they are) and the bodies seen before it, by name."""

    made: _Made
    written: dict[str, tuple[exp.Query, _Scope]] = field(default_factory=dict)

    def substitute(self, tree: exp.Expr) -> None:
        """Replace, in place, every plain relation of ``tree`` this scope names with its
        body in parentheses, under the alias the FROM item gives it (else its name), and
        every window call's stream it names with the stream made of its body."""
        for table in list(tree.find_all(exp.Table)):
            call = table.this
            if isinstance(call, exp.Anonymous) and call.name.upper() in WINDOW_FUNCTIONS:
                source = call.expressions[0] if call.expressions else None
                if (
                    isinstance(source, exp.Column)
                    and not source.table
                    and (name := self.stream_of(source.name, source)) is not None
                ):
                    source.replace(exp.column(exp.to_identifier(name)))
                continue
            if not isinstance(call, exp.Identifier) or table.args.get("db"):
                continue
            if (body := self.inlined(call.name)) is None:
                continue
            alias = table.args.get("alias")
            table.replace(
                exp.Subquery(
                    this=body,
                    alias=alias.copy() if alias is not None else exp.TableAlias(this=call.copy()),
                )
            )

    def inlined(self, name: str) -> exp.Query | None:
        """The body of ``name`` with the expressions before it inlined; None when this
        scope does not define ``name``."""
        if name not in self.written:
            return None
        body, before = self.written[name]
        holder = exp.Subquery(this=body.copy())
        before.substitute(holder)
        return holder.this

    def stream_of(self, name: str, at: exp.Expr) -> str | None:
        """The stream made of ``name``'s body, the expressions it reads made streams too
        (a stream reads streams); None when this scope does not define ``name``."""
        if name not in self.written:
            return None
        body, before = self.written[name]
        holder = exp.Subquery(this=body.copy())
        for table in list(holder.find_all(exp.Table)):
            call = table.this
            if (
                isinstance(call, exp.Identifier)
                and not table.args.get("db")
                and (read := before.stream_of(call.name, table)) is not None
            ):
                alias = table.args.get("alias")
                table.replace(
                    exp.alias_(
                        exp.table_(exp.to_identifier(read)),
                        alias.this if alias else call.copy(),
                        table=True,
                    )
                )
        before.substitute(holder)  # window calls inside it
        return self.made.stream_of(holder.this, at)


def _scope(with_: exp.With, made: _Made) -> _Scope:
    """The scope of ``with_``: each expression's body as written, with what it sees."""
    if with_.args.get("recursive"):
        raise UnsupportedSQL(
            "WITH RECURSIVE is not supported in a stream: a stream's query is computed over "
            "each run's rows, never iterated; write the iterations out, or compute the "
            "closure where you read the stream",
            position=position_of(with_),
        )
    scope = _Scope(made)
    for cte in with_.expressions:
        name = cte.alias_or_name
        body = cte.this
        if not isinstance(body, exp.Select | exp.Union):
            raise UnsupportedSQL(
                f"the common table expression {name!r} is a "
                f"{type(body).__name__.upper()}: a stream's WITH queries only read "
                "(SELECT); write rows with INSERT, UPDATE or DELETE outside the stream",
                position=position_of(cte),
            )
        before = _Scope(made, dict(scope.written))
        renamed = _renamed(name, body.copy(), cte.args["alias"].columns, cte)
        scope.written[name] = (renamed, before)
    return scope


def _renamed(name: str, body: exp.Query, columns: list[exp.Identifier], cte: exp.CTE) -> exp.Query:
    """``body`` with its first columns named by the expression's column list, as PostgreSQL
    names them (``WITH t (a, b) AS (SELECT x, y ...)``)."""
    if not columns:
        return body
    first = body
    while isinstance(first, exp.Union):
        first = first.this
    assert isinstance(first, exp.Select)
    if any(isinstance(e, exp.Star) or e.is_star for e in first.expressions):
        raise UnsupportedSQL(
            f"the common table expression {name!r} names its columns over SELECT *: name "
            "them in its SELECT instead (SELECT a AS x, ...)",
            position=position_of(cte),
        )
    if len(columns) > len(first.expressions):
        raise UnsupportedSQL(
            f"the common table expression {name!r} has {len(first.expressions)} columns "
            f"available but {len(columns)} columns specified",
            position=position_of(cte),
        )
    for item, column in zip(list(first.expressions), columns, strict=False):
        value = item.this if isinstance(item, exp.Alias) else item
        item.replace(exp.alias_(value.copy(), column.copy()))
    return body
