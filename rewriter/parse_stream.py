"""Pass 1: CREATE STREAM text -> a raw or derived stream statement (sqlglot AST, checked)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.errors import ParseError, TokenError
from sqlglot.parsers.postgres import PostgresParser
from sqlglot.tokens import Token, TokenType

from rewriter.desugar import WindowClause, cut_window_clauses, desugar
from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from rewriter.flink_syntax import SessionPartition, desugar_functions, flink_function
from rewriter.flink_syntax import read as read_flink
from rewriter.grouping_sets import grouping_sets
from rewriter.inline_ctes import inline_ctes
from rewriter.naming import check_column_name, check_stream_name
from rewriter.positions import Place, line_and_column, located, position_of, record_positions
from rewriter.resolve_window import parse_interval
from rewriter.scalar_subqueries import scalar_subqueries
from rewriter.semi_joins import semi_joins
from rewriter.types import ColumnSpec, sql_type_from_sqlglot

RAW_OPTIONS = ("event_time", "delay", "retention")
# PostgreSQL's limit of 1600 columns per table, less the raw archive's run column.
MAX_RAW_COLUMNS = 1599
EXAMPLE = (
    "CREATE STREAM impsns (campaign text, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')  or  CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, "
    "window_end AS t FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)


@dataclass(frozen=True)
class RawStreamStatement:
    name: str
    columns: tuple[ColumnSpec, ...]
    event_time: str
    delay_us: int = 0  # WITH (delay = '30 seconds'): how far the watermark trails event time
    retention_us: int = 0  # WITH (retention = '30 days'): raw rows kept that long; 0 = forever


@dataclass(frozen=True)
class DerivedStreamStatement:
    name: str
    select: exp.Select | exp.Union  # UNION ALL: a stream of rows of several raw streams
    # The streams made with it for the common table expressions its window calls read:
    # (name, CREATE STREAM), created before it (rewriter.inline_ctes).
    with_streams: tuple[tuple[str, str], ...] = ()
    with_bodies: tuple[exp.Query, ...] = ()  # their queries, positions in the statement kept


StreamStatement = RawStreamStatement | DerivedStreamStatement


def parse_stream(sql: str) -> StreamStatement:
    """Parse one CREATE STREAM statement; anything else is refused with the expected form.

    The window syntax of seeds/003 (``<SLICES ...>``, ``cq_close(*)``) is accepted as sugar
    for the standard form (rewriter.desugar). Positions in the returned trees, and in the
    errors raised, are positions in ``sql`` (rewriter.positions).
    """
    flink = read_flink(sql)  # Flink's spellings, every offset kept
    sql = flink.text
    tokens = _tokenize(sql)
    _check_interval_literals(sql, tokens)
    _refuse_foreign_clauses(sql, tokens)
    body = [t for t in tokens if t.token_type != TokenType.SEMICOLON]
    semicolons = [t for t in tokens if t.token_type == TokenType.SEMICOLON]
    if not body:
        raise InvalidSQL(f"empty statement; expected CREATE STREAM, e.g. {EXAMPLE}")
    if semicolons and semicolons[0].start < body[-1].start:
        raise InvalidSQL(
            "only one statement per request is accepted; this ';' ends the first",
            position=_place(sql, semicolons[0]),
        )
    if (java := flink_function(sql)) is not None:
        raise java
    if len(body) < 3 or body[0].token_type != TokenType.CREATE or body[1].text.upper() != "STREAM":
        wrong = body[1] if body[0].token_type == TokenType.CREATE and len(body) > 1 else body[0]
        raise InvalidSQL(
            f"expected a CREATE STREAM statement, e.g. {EXAMPLE}", position=_place(sql, wrong)
        )
    # sqlglot knows CREATE TABLE, not <SLICES ...>: swap the keyword and blank the window
    # clauses, keeping every offset, so that positions in the tree are positions in sql.
    keyword = body[1]
    text = (
        sql[: keyword.start]
        + "TABLE".ljust(keyword.end + 1 - keyword.start)
        + sql[keyword.end + 1 :]
    )
    text, windows = cut_window_clauses(text, tokens)
    text = _session_calls(text, tokens)
    statement = _parse(text, sql)
    if not isinstance(statement, exp.Create) or statement.kind != "TABLE":
        raise InvalidSQL(f"expected a CREATE STREAM statement, e.g. {EXAMPLE}")
    record_positions(statement, sql, tokens)
    for identifier in statement.find_all(exp.Identifier):
        # PostgreSQL folds unquoted names to lower case (dateTime is datetime): so do the
        # passes, which compare names as strings.
        if not identifier.quoted and identifier.this != identifier.this.lower():
            identifier.set("this", identifier.this.lower())
    if statement.expression is not None:
        statement.set("expression", statement.expression.transform(desugar_functions))
    for flag, shown, word in (
        ("exists", "IF NOT EXISTS", "IF"),
        ("replace", "OR REPLACE", "OR"),
        ("unique", "UNIQUE", "UNIQUE"),
    ):
        if statement.args.get(flag):
            at = next((t for t in body if t.text.upper() == word), body[0])
            raise UnsupportedSQL(
                f"CREATE STREAM does not support {shown}", position=_place(sql, at)
            )
    if statement.expression is not None:
        _check_session_partitions(statement.expression, flink.partitions, sql)
        return _derived(statement, windows)
    return _raw(statement)


def derived_select(sql: str) -> exp.Select | exp.Union | None:
    """The SELECT of a CREATE STREAM ... AS statement, or None for any other statement or one
    that does not parse (planning it reports its own error): what the server reads to look
    up the tables and functions a statement may name before planning it."""
    try:
        statement = parse_stream(sql)
    except (StrataError, RecursionError):
        return None
    if not isinstance(statement, DerivedStreamStatement):
        return None
    if not statement.with_streams:
        return statement.select
    # What the streams made with it read is read for it: a union of their queries.
    selects = [statement.select]
    selects += [s for _, text in statement.with_streams if (s := derived_select(text))]
    union: exp.Select | exp.Union = selects[0]
    for select in selects[1:]:
        union = exp.union(union, select, distinct=False)
    return union


def _refuse_foreign_clauses(sql: str, tokens: list[Token]) -> None:
    """Refuse by name, before the parser (which would only say it did not expect them), the
    clauses of other engines' SQL that Strata has no counterpart for, with what to write."""
    words = [t for t in tokens if t.token_type not in (TokenType.STRING, TokenType.IDENTIFIER)]
    for k, token in enumerate(words):
        following = words[k + 1] if k + 1 < len(words) else None
        word = token.text.upper()
        if word == "MATCH_RECOGNIZE":
            raise UnsupportedSQL(
                "MATCH_RECOGNIZE (row pattern matching) is not supported; for bursts of a "
                "key's rows separated by a quiet gap, group by SESSION(stream, t, INTERVAL "
                "'gap') windows; for a row followed by another of the same key within a "
                "time, join the stream with itself on the key and an interval of time",
                position=_place(sql, token),
            )
        if word == "EMIT" and following is not None:
            if following.text.upper() not in ("CHANGES", "FINAL", "ON", "AFTER"):
                continue
            clause = sql[token.start : words[-1].end + 1].split(";")[0].strip()
            raise UnsupportedSQL(
                f"{clause} is not needed: a "
                "stream's view has every window from its first row on and is revised when "
                "late rows come. To be told of each change, follow the stream's change feed "
                "(GET /streams/<name>/changes, or SUBSCRIBE over the SQL port); to read only "
                "windows whose rows are all in, join the view with strata_window_status on "
                "window_end WHERE complete",
                position=_place(sql, token),
            )


def _check_session_partitions(
    query: exp.Expr, partitions: tuple[SessionPartition, ...], sql: str
) -> None:
    """A Flink session window's PARTITION BY keys must be what the query groups by: Strata
    forms sessions per GROUP BY keys (rewriter.flink_syntax removed the clause)."""
    for partition in partitions:
        where = line_and_column(sql, partition.offset)
        for select in query.find_all(exp.Select):
            source = select.args.get("from_")
            calls = source.find_all(exp.Anonymous) if source is not None else ()
            if not any(c.name.upper() == SESSION_CALL and position_of(c) == where for c in calls):
                continue
            group = select.args.get("group")
            grouped = {
                e.name
                for e in (group.expressions if group is not None else [])
                if isinstance(e, exp.Column) and e.name not in ("window_start", "window_end")
            }
            if grouped == set(partition.keys):
                continue
            if not partition.keys:
                raise UnsupportedSQL(
                    "TABLE(SESSION(TABLE s, ...)) without PARTITION BY forms sessions over "
                    f"all rows, and this query groups them by {', '.join(sorted(grouped))}, "
                    "which Strata cannot do: it forms a session per GROUP BY keys. For "
                    f"sessions per key, write SESSION(TABLE s PARTITION BY "
                    f"{', '.join(sorted(grouped))}, ...)",
                    position=where,
                )
            raise UnsupportedSQL(
                f"SESSION(... PARTITION BY {', '.join(partition.keys)}) with GROUP BY "
                f"{', '.join(sorted(grouped)) or 'no keys'}: Strata forms a session per "
                "GROUP BY keys, so group by exactly the PARTITION BY keys (with "
                "window_start, window_end)",
                position=where,
            )


# sqlglot reads SESSION as a keyword: a SESSION(...) window is parsed as a call of this
# name, of the same length, so that offsets hold (rewriter/build_session.py).
SESSION_CALL = "SESSWIN"


def _session_calls(text: str, tokens: list[Token]) -> str:
    for token, following in zip(tokens, tokens[1:], strict=False):
        if token.text.upper() == "SESSION" and following.token_type == TokenType.L_PAREN:
            text = text[: token.start] + SESSION_CALL + text[token.end + 1 :]
    return text


_INTERVAL_PART = re.compile(r"\s*-?[0-9]+(?:\.[0-9]+)?\s*[a-zA-Z]+\s*")


def _check_interval_literals(sql: str, tokens: list[Token]) -> None:
    """Refuse INTERVAL '1 minute <anything else>' (and the same in <SLICES ...>): sqlglot
    reads such a literal as its one quantity and drops the rest, where PostgreSQL refuses
    the whole literal."""
    for keyword, literal in zip(tokens, tokens[1:], strict=False):
        if literal.token_type != TokenType.STRING or not (
            keyword.token_type == TokenType.INTERVAL
            or keyword.text.upper() in ("SLICES", "VISIBLE", "ADVANCE")
        ):
            continue
        parts = _INTERVAL_PART.findall(literal.text)
        if len(parts) == 1 and _INTERVAL_PART.sub("", literal.text).strip():
            raise InvalidSQL(
                f"cannot read the interval {literal.text!r}: expected quantities and units "
                "such as '5 minutes' or '1 hour 30 minutes'",
                position=_place(sql, literal),
            )


def _place(sql: str, token: Token) -> tuple[int, int]:
    return Place.of_token(sql, token).position


def _tokenize(sql: str) -> list[Token]:
    try:
        return list(Postgres().tokenize(sql))
    except TokenError as err:
        # sqlglot says where an unterminated literal starts as "line:offset".
        found = re.search(r"Missing (\S+) from \d+:(\d+)", str(err.__cause__ or ""))
        if found is not None and int(found.group(2)) < len(sql):
            raise InvalidSQL(
                f"syntax error: missing the closing {found.group(1)} of the literal starting here",
                position=line_and_column(sql, int(found.group(2))),
            ) from None
        if isinstance(err.__cause__, IndexError):  # sqlglot ran off the end of the text
            opened = sql.rfind("/*")
            if opened >= 0 and "*/" not in sql[opened + 2 :]:
                raise InvalidSQL(
                    "syntax error: the comment starting here is never closed (*/)",
                    position=line_and_column(sql, opened),
                ) from None
            raise InvalidSQL(
                "syntax error: the statement ends inside a comment or a quoted literal"
            ) from None
        raise InvalidSQL(f"syntax error: {err.__cause__ or err}") from None


class _StreamParser(PostgresParser):
    """PostgreSQL's parser, except that what it cannot read is a syntax error there, not an
    opaque command (sqlglot's fallback for statements it half understands)."""

    # sqlglot turns to_char() into strftime's terms, losing the pattern as written: keep
    # it a call of its own (typed and translated by rewriter.functions).
    FUNCTIONS = {
        **PostgresParser.FUNCTIONS,
        "TO_CHAR": lambda args: exp.Anonymous(this="to_char", expressions=args),
    }

    def _parse_as_command(self, start: Token) -> exp.Command:
        self.raise_error("not expected here", self._curr or self._prev)
        return super()._parse_as_command(start)

    def _parse_date_part(self) -> exp.Expr:
        # sqlglot reads date_part() as EXTRACT, but PostgreSQL's date_part() returns
        # double precision and extract() numeric: keep it a call of its own, so it is
        # typed (or refused) as itself.
        extract = super()._parse_date_part()
        field = extract.this.name.lower() if extract.this is not None else ""
        return exp.Anonymous(
            this="date_part", expressions=[exp.Literal.string(field), extract.expression]
        )


def parse_expression(text: str) -> exp.Expr:
    """A PostgreSQL expression, read as statements read it (to_char, date_part kept)."""
    dialect = Postgres()
    select = _StreamParser(dialect=dialect).parse(dialect.tokenize(f"SELECT {text}"), text)[0]
    assert isinstance(select, exp.Select)
    return select.expressions[0]


def _parse(text: str, sql: str) -> exp.Expr | None:
    """Parse ``text``, the statement ``sql`` made readable for sqlglot (same offsets)."""
    dialect = Postgres()
    try:
        statements = _StreamParser(dialect=dialect).parse(dialect.tokenize(text), text)
    except ParseError as err:
        first = err.errors[0] if err.errors else {}
        problem = _readable(str(first.get("description", err)))
        near = first.get("highlight") or ""
        line, column = first.get("line"), first.get("col")
        if not isinstance(line, int) or not isinstance(column, int):
            raise InvalidSQL(f"syntax error: {problem}") from None
        # sqlglot gives where the offending token ends; the error names where it starts.
        line_start = 0
        for _ in range(line - 1):
            found = text.find("\n", line_start)
            if found < 0:  # sqlglot miscounts lines after a lone '$' at a line's end
                raise InvalidSQL(f"syntax error: {problem}") from None
            line_start = found + 1
        start = max(line_start + column - max(len(near), 1), 0)
        near = sql[start : start + len(near)]
        shown = f" at {near!r}" if near.strip() else ""
        raise InvalidSQL(
            f"syntax error{shown}: {problem}", position=line_and_column(sql, start)
        ) from None
    return statements[0] if len(statements) == 1 else None


def _readable(description: str) -> str:
    """sqlglot's messages without its internal reprs of tokens and classes."""
    description = re.sub(r"<Token token_type: [^,]+, text: (.*?), line: .*?>", r"'\1'", description)
    return re.sub(r"<class '(?:[\w.]+\.)?(\w+)'>", r"\1", description)


def _options(statement: exp.Create) -> dict[str, exp.Property]:
    found: dict[str, exp.Property] = {}
    properties = statement.args.get("properties")
    for prop in properties.expressions if properties else []:
        if not isinstance(prop, exp.Property) or not isinstance(
            prop.args.get("value"), exp.Literal
        ):
            raise UnsupportedSQL(
                f"unsupported stream property {prop.sql('postgres')!r}; "
                f"supported: WITH ({', '.join(o + ' = ...' for o in RAW_OPTIONS)})",
                position=position_of(prop),
            )
        key = prop.name.lower()
        if key not in RAW_OPTIONS:
            raise UnsupportedSQL(
                f"unknown stream option {key!r}; supported options: {', '.join(RAW_OPTIONS)}",
                position=position_of(prop),
            )
        found[key] = prop
    return found


def _raw(statement: exp.Create) -> RawStreamStatement:
    schema = statement.this
    if not isinstance(schema, exp.Schema) or not isinstance(schema.this, exp.Table):
        raise InvalidSQL(
            f"a raw stream declares its columns, e.g. {EXAMPLE}", position=position_of(schema)
        )
    name = _stream_name(schema.this)
    columns: list[ColumnSpec] = []
    for column_def in schema.expressions:
        if not isinstance(column_def, exp.ColumnDef):
            raise UnsupportedSQL(
                f"{column_def.sql('postgres')!r}: table constraints are not supported in a stream",
                position=position_of(column_def),
            )
        with located(column_def):
            column = check_column_name(column_def.this.name)
        constraints = column_def.args.get("constraints")
        if constraints:
            raise UnsupportedSQL(
                f"column {column!r}: constraints are not supported; a stream declares names "
                "and types only",
                position=position_of(constraints[0]) or position_of(column_def),
            )
        if any(c.name == column for c in columns):
            raise InvalidSQL(
                f"column {column!r} is declared twice", position=position_of(column_def)
            )
        kind = column_def.args.get("kind")
        if kind is None:
            raise InvalidSQL(f"column {column!r} has no type", position=position_of(column_def))
        with located(kind if position_of(kind) else column_def):
            columns.append(ColumnSpec(column, sql_type_from_sqlglot(kind, column=column)))
    if not columns:
        raise InvalidSQL(
            f"a raw stream needs at least one column, e.g. {EXAMPLE}", position=position_of(schema)
        )
    if len(columns) > MAX_RAW_COLUMNS:
        raise UnsupportedSQL(
            f"a raw stream has at most {MAX_RAW_COLUMNS} columns (PostgreSQL's limit per "
            f"table, less Strata's run column); this one declares {len(columns)}",
            position=position_of(schema.expressions[MAX_RAW_COLUMNS]),
        )
    option = _options(statement).get("event_time")
    if option is None:
        raise InvalidSQL(
            "a raw stream names its event-time column: add WITH (event_time = 'column')"
        )
    event_time = option.args["value"].name
    where = position_of(option.args["value"])
    spec = next((c for c in columns if c.name == event_time), None)
    if spec is None:
        raise InvalidSQL(
            f"event_time names {event_time!r}, which is not a declared column", position=where
        )
    if spec.type.name != "timestamptz":
        raise UnsupportedSQL(
            f"the event-time column {event_time!r} must be timestamptz, not {spec.type.pg()}",
            position=where,
        )
    options = _options(statement)
    delay_us, retention_us = (_interval_option(options.get(o)) for o in ("delay", "retention"))
    return RawStreamStatement(name, tuple(columns), event_time, delay_us, retention_us)


def _interval_option(option: exp.Property | None) -> int:
    """Microseconds of an interval-valued option such as delay = '30 seconds' (0 if unset)."""
    if option is None:
        return 0
    with located(option):
        return parse_interval(exp.Interval(this=exp.Literal.string(option.args["value"].name)))


def _derived(statement: exp.Create, windows: tuple[WindowClause, ...]) -> DerivedStreamStatement:
    target = statement.this
    names: list[exp.Expr] = []
    if isinstance(target, exp.Schema) and isinstance(target.this, exp.Table):
        names = list(target.expressions)  # CREATE STREAM s (a, b) AS SELECT ...
        if not all(isinstance(n, exp.Identifier) for n in names):
            raise UnsupportedSQL(
                "a derived stream takes its columns' types from its SELECT: drop the list, or "
                "list the names alone, CREATE STREAM s (a, b) AS SELECT ...",
                position=position_of(names[0] if names else target),
            )
        target = target.this
    if not isinstance(target, exp.Table):
        raise UnsupportedSQL(
            "a derived stream takes its columns from its SELECT; drop the list",
            position=position_of(target.expressions[0] if target.expressions else target),
        )
    name = _stream_name(target)
    if statement.args.get("properties"):
        raise UnsupportedSQL(
            "a derived stream takes no WITH options",
            position=position_of(statement.args["properties"]),
        )
    query = statement.expression
    # seeds/003 writes AS (SELECT ...).
    while isinstance(query, exp.Subquery) and not query.alias:
        query = query.this
    inlined = inline_ctes(query, name)
    query = (
        inlined.query if windows else grouping_sets(scalar_subqueries(semi_joins(inlined.query)))
    )
    if isinstance(query, exp.Union) and not windows:
        union = _named_union(query, names) if names else query.copy()
        return DerivedStreamStatement(name, union, inlined.companions, inlined.bodies)
    if isinstance(query, exp.Intersect | exp.Except):
        kind, test = (
            ("INTERSECT", "EXISTS")
            if isinstance(query, exp.Intersect)
            else ("EXCEPT", "NOT EXISTS")
        )
        raise UnsupportedSQL(
            f"{kind} is not supported: keep the rows of the first query with (or without) a "
            f"match in the second with {test}, SELECT DISTINCT k FROM a WHERE {test} (SELECT "
            "1 FROM b WHERE b.k = a.k) (where NULL keys match nothing)",
            position=position_of(query),
        )
    if not isinstance(query, exp.Select):
        raise UnsupportedSQL(
            f"a derived stream is defined by one SELECT (found {type(query).__name__.upper()}), "
            f"e.g. {EXAMPLE}",
            position=position_of(query),
        )
    select = _distinct_as_groups(_window_subqueries(_group_windows(desugar(query, windows))))
    if names:
        select = _named_columns(select, names)
    return DerivedStreamStatement(name, select, inlined.companions, inlined.bodies)


# Flink's group windows (GROUP BY k, TUMBLE(t, size), with TUMBLE_START(t, size) and
# TUMBLE_END(...) selected; HOP(t, slide, size) and SESSION(t, gap) alike): the window
# call, its start and its end functions.
_GROUP_WINDOWS = {"TUMBLE": "TUMBLE", "HOP": "HOP", SESSION_CALL: "SESSION"}


def _group_windows(select: exp.Select) -> exp.Select:
    """``SELECT k, count(*), TUMBLE_START(t, i) FROM s GROUP BY k, TUMBLE(t, i)`` (Flink's
    group windows) as ``SELECT k, count(*), window_start FROM TUMBLE(s, t, i) GROUP BY k,
    window_start, window_end``; other statements as they are."""
    group = select.args.get("group")
    calls = [
        key
        for key in (group.expressions if group is not None else [])
        if isinstance(key, exp.Anonymous)
        and key.name.upper() in _GROUP_WINDOWS
        and key.expressions
        and isinstance(key.expressions[0], exp.Column)
    ]
    if not calls:
        return select
    from_ = select.args.get("from_")
    source = from_.this if from_ is not None else None
    kind = _GROUP_WINDOWS[calls[0].name.upper()]
    if len(calls) > 1 or select.args.get("joins") or not isinstance(source, exp.Table):
        raise UnsupportedSQL(
            f"a group window GROUP BY {kind}(...) reads one stream: write FROM "
            f"{kind}(stream, time, INTERVAL ...) and GROUP BY window_start, window_end",
            position=position_of(calls[0]),
        )
    rewritten = select.copy()
    call = next(k for k in rewritten.args["group"].expressions if k == calls[0])
    time, *sizes = call.expressions
    window = exp.Anonymous(
        this=call.name,
        expressions=[exp.column(source.name), exp.column(time.name), *(s.copy() for s in sizes)],
    )
    # The window reads the stream itself: its columns are named without the alias.
    qualifier = source.alias_or_name
    for column in list(rewritten.find_all(exp.Column)):
        if column.table == qualifier:
            column.set("table", None)
    rewritten.args["from_"].set("this", exp.Table(this=window))

    keys = [k for k in rewritten.args["group"].expressions if k is not call]
    keys += [exp.column("window_start"), exp.column("window_end")]
    rewritten.args["group"].set("expressions", keys)

    def bounds(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Anonymous):
            name = node.name.upper()
            for suffix, column in (("_START", "window_start"), ("_END", "window_end")):
                if name == f"{kind}{suffix}":
                    return exp.column(column)
            if name.startswith(f"{kind}_"):
                raise UnsupportedSQL(
                    f"{name}(...) is not supported; select window_start or window_end",
                    position=position_of(node),
                )
        return node

    rewritten.set("expressions", [e.transform(bounds) for e in rewritten.expressions])
    return rewritten


def _distinct_as_groups(select: exp.Select) -> exp.Select:
    """``SELECT DISTINCT a, b FROM ...`` without aggregates as ``SELECT a, b FROM ... GROUP
    BY a, b``: the same rows, as a stream of groups (with aggregates, or with ``*``, it is
    left as written, for the passes that take or refuse it)."""
    distinct = select.args.get("distinct")
    if distinct is None or distinct.args.get("on") is not None or select.args.get("group"):
        return select
    items = select.expressions
    if any(isinstance(i, exp.Star) or (isinstance(i, exp.Column) and i.is_star) for i in items):
        return select
    if select.find(exp.AggFunc, exp.Window) is not None:
        return select
    grouped = select.copy()
    grouped.set("distinct", None)
    keys = [(i.this if isinstance(i, exp.Alias) else i).copy() for i in grouped.expressions]
    grouped.set("group", exp.Group(expressions=keys))
    return grouped


def _window_subqueries(select: exp.Select) -> exp.Select:
    """A join input ``(SELECT * FROM TUMBLE(s, ...)) AS x`` (Flink's window join, each side
    a windowing table function in parentheses) as the window itself, ``TUMBLE(s, ...) AS
    x``: the same rows, which joins of windows read."""
    if not select.args.get("joins"):
        return select
    rewritten = select.copy()
    from_ = rewritten.args.get("from_")
    items = [from_.this if from_ is not None else None]
    items += [j.this for j in rewritten.args.get("joins") or []]
    for item in items:
        if not isinstance(item, exp.Subquery) or not isinstance(item.this, exp.Select):
            continue
        inner = item.this
        source = inner.args.get("from_")
        window = source.this if source is not None else None
        if (
            len(inner.expressions) == 1
            and isinstance(inner.expressions[0], exp.Star)
            and isinstance(window, exp.Table)
            and isinstance(window.this, exp.Anonymous)
            and window.this.name.upper() in _GROUP_WINDOWS
            and not window.alias
            and not any(inner.args.get(k) for k in ("joins", "where", "group", "having", "order"))
        ):
            call = window.this.copy()
            alias = item.alias
            item.replace(
                exp.alias_(exp.Table(this=call), alias, table=True)
                if alias
                else exp.Table(this=call)
            )
    return rewritten


def _named_union(union: exp.Union, names: list[exp.Expr]) -> exp.Union:
    """CREATE STREAM s (a, b) AS q1 UNION ALL q2: the union's columns are its first
    branch's, named a and b."""
    named = union.copy()
    first: exp.Expr = named
    while isinstance(first, exp.Union):
        first = first.this
    if not isinstance(first, exp.Select):
        raise UnsupportedSQL(
            "a column list names the columns of the first branch's SELECT: write it without "
            "parentheses",
            position=position_of(names[0]),
        )
    first.replace(_named_columns(first, names))
    return named


def _named_columns(select: exp.Select, names: list[exp.Expr]) -> exp.Select:
    """CREATE STREAM s (a, b) AS SELECT x, y ...: the SELECT's columns named a and b, in
    order (as a view's column list names them, and as Flink's INSERT INTO a sink's columns)."""
    items = select.expressions
    if any(isinstance(i, exp.Star) or (isinstance(i, exp.Column) and i.is_star) for i in items):
        raise UnsupportedSQL(
            "a column list names the SELECT's columns one by one: list them instead of *",
            position=position_of(names[0]),
        )
    if len(items) != len(names):
        raise UnsupportedSQL(
            f"the column list names {len(names)} columns and the SELECT has {len(items)}",
            position=position_of(names[0]),
        )
    named = select.copy()
    columns = []
    for item, name in zip(named.expressions, names, strict=True):
        with located(name):
            column = check_column_name(name.name)
        value = item.this if isinstance(item, exp.Alias) else item
        columns.append(exp.alias_(value, column, quoted=True))
    named.set("expressions", columns)
    return named


def _stream_name(table: exp.Table) -> str:
    if table.args.get("db") or table.args.get("catalog"):
        raise InvalidSQL(
            f"stream names are not schema-qualified: {table.sql('postgres')!r}",
            position=position_of(table),
        )
    with located(table):
        return check_stream_name(table.name)
