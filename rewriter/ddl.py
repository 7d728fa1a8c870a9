"""Builders of the PostgreSQL DDL the build passes emit: tables, columns, views, indexes,
functions.

Every statement is built as a sqlglot expression and rendered for PostgreSQL, so quoting
stays right (a function, whose definition sqlglot does not write, with psycopg's ``sql``);
the names come from rewriter.naming.
"""

from __future__ import annotations

from psycopg import sql
from sqlglot import exp

from rewriter import naming
from rewriter.types import SqlType


def table(name: str, schema: str = naming.INTERNAL_SCHEMA) -> exp.Table:
    return exp.table_(name, db=schema, quoted=True)


def column_def(name: str, pg_type: SqlType | str, *, not_null: bool = False) -> exp.ColumnDef:
    type_name = pg_type.pg() if isinstance(pg_type, SqlType) else pg_type
    constraints = []
    if type_name == "text":
        # Text compares by code point in Spark; the archives and the views compare the same
        # way, so min/max and grouping agree between the engines on any server collation.
        constraints.append(
            exp.ColumnConstraint(kind=exp.CollateColumnConstraint(this=exp.Var(this='"C"')))
        )
    if not_null:
        constraints.append(exp.ColumnConstraint(kind=exp.NotNullColumnConstraint()))
    return exp.ColumnDef(
        this=exp.to_identifier(name, quoted=True),
        kind=exp.DataType.build(type_name, dialect="postgres"),
        constraints=constraints or None,
    )


def create_table(
    target: exp.Table, columns: list[exp.ColumnDef], *, if_not_exists: bool = False
) -> str:
    return exp.Create(
        this=exp.Schema(this=target, expressions=columns), kind="TABLE", exists=if_not_exists
    ).sql("postgres")


def create_view(name: str, query: exp.Query) -> str:
    return exp.Create(this=table(name, naming.PUBLIC_SCHEMA), kind="VIEW", expression=query).sql(
        "postgres"
    )


def create_index(
    name: str,
    target: exp.Table,
    columns: list[exp.Expr],
    *,
    using: str | None = None,
    if_not_exists: bool = False,
) -> str:
    params = exp.IndexParameters(columns=[exp.Ordered(this=c) for c in columns])
    if using is not None:
        params.set("using", exp.Var(this=using))
    return exp.Create(
        this=exp.Index(this=exp.to_identifier(name), table=target.copy(), params=params),
        kind="INDEX",
        exists=if_not_exists,
    ).sql("postgres")


def drop(kind: str, target: exp.Table) -> str:
    return exp.Drop(tables=[target], kind=kind, exists=True).sql("postgres")


# How every function statement create_set_function writes begins: sqlglot does not read
# them, so the code that reads a plan's statements (rewriter.rename) tells them by it.
CREATE_FUNCTION = "CREATE OR REPLACE FUNCTION "


def create_set_function(name: str, rows_of: exp.Table, query: exp.Query) -> str:
    """``CREATE OR REPLACE FUNCTION`` INTERNAL_SCHEMA.``name``() returning the rows of
    ``query``, of the table ``rows_of``'s row type. STABLE, so that it reads the snapshot of
    the statement calling it; a SQL body with a SET clause, which PostgreSQL does not inline
    but plans once per session and keeps; run with its owner's privileges (a reader of a
    view calling it reads no internal table itself), with pg_catalog first on its search
    path, so that nothing created in public stands in for a built-in it calls."""
    return (
        sql.SQL(
            CREATE_FUNCTION + "{name}() RETURNS SETOF {rows} LANGUAGE sql STABLE "
            "PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, public, "
            "pg_temp AS {body}"
        )
        .format(
            name=sql.Identifier(naming.INTERNAL_SCHEMA, name),
            rows=sql.Identifier(str(rows_of.db), rows_of.name),
            body=_dollar_quoted(query.sql("postgres")),
        )
        .as_string()
    )


def create_check_function(name: str, query: exp.Query) -> str:
    """``CREATE OR REPLACE FUNCTION`` INTERNAL_SCHEMA.``name``() returning the boolean
    ``query`` computes: a check a view makes once per read (a one-time filter), in a
    function so that it is planned once per session, not at every read. PARALLEL
    RESTRICTED: PostgreSQL then evaluates the filter in the leader, above any parallel
    workers of what it gates, and starts none when it is false (a filter of plain initial
    plans it put below them, and the workers started for nothing cost a caught-up read
    more than the read). STABLE, with its owner's privileges and pg_catalog first on its
    search path, as create_set_function's."""
    return (
        sql.SQL(
            CREATE_FUNCTION + "{name}() RETURNS boolean LANGUAGE sql STABLE "
            "PARALLEL RESTRICTED SECURITY DEFINER SET search_path = pg_catalog, public, "
            "pg_temp AS {body}"
        )
        .format(
            name=sql.Identifier(naming.INTERNAL_SCHEMA, name),
            body=_dollar_quoted(query.sql("postgres")),
        )
        .as_string()
    )


def check_call(name: str) -> exp.Expr:
    """INTERNAL_SCHEMA.``name``() in an expression (``name`` needs no quotes)."""
    return exp.Dot(
        this=exp.to_identifier(naming.INTERNAL_SCHEMA, quoted=True),
        expression=exp.Anonymous(this=name, expressions=[]),
    )


def _dollar_quoted(body: str) -> sql.Composable:
    """A function's body between dollar quotes whose tag it does not hold."""
    tag = "strata"
    while f"${tag}$" in body:
        tag += "_"
    return sql.SQL("${tag}$ {body} ${tag}$").format(tag=sql.SQL(tag), body=sql.SQL(body))


def create_windows_function(name: str, archive: exp.Table) -> str:
    """``CREATE OR REPLACE FUNCTION`` INTERNAL_SCHEMA.``name``() returning the starts of the
    windows of the partial archive ``archive`` that hold partial rows: those the table of
    waiting windows lists for it (naming.WAITING_WINDOWS_TABLE, kept by the archive's
    trigger and the reducer's fold), from the oldest window of the archive on. The list may
    hold windows whose rows a fold took while a commit held their row (the fold skips it,
    and a later fold unlists it): one listed from the oldest on is merged on read, exact
    either way; one older than every partial row would be read twice, so it is left out.
    One range of the table's index and one probe of the archive's, where skipping through
    the archive's index a window at a time cost 3.5 ms a call with 288 windows waiting (the
    dashboard benchmark's one campaign's hour then: 8-15 ms; with the list, 5.4 ms).

    STABLE, so that it reads the snapshot of the statement calling it; PARALLEL SAFE, so
    that the view's scans stay parallel (each worker calls it); run with its owner's
    privileges (a reader of a view calling it reads no internal table itself). A parallel
    worker cannot run a function with a SET clause, so it has no search path of its own:
    every name in it is qualified instead, its operators too. ROWS 1, the estimate SELECT
    DISTINCT had over an empty archive: caught up, the planner put parallel workers behind
    the merge a one-time filter skips when it expected PostgreSQL's default of 1,000
    windows (a sketch stream's read took 20.5 ms, 3.8 ms with ROWS 1); with windows
    waiting, it probes the consolidated states window by window, what a few hundred want
    too."""
    column = sql.Identifier(naming.WINDOW_START_COLUMN)
    source = sql.Identifier(str(archive.db), archive.name)
    body = sql.SQL(
        "SELECT w.{c} FROM {listed} AS w WHERE w.{archive} OPERATOR(pg_catalog.=) {oid} "
        "AND w.{c} OPERATOR(pg_catalog.>=) (SELECT pg_catalog.min(a.{c}) FROM {t} AS a)"
    ).format(
        c=column,
        listed=sql.Identifier(naming.INTERNAL_SCHEMA, naming.WAITING_WINDOWS_TABLE),
        archive=sql.Identifier(naming.WAITING_ARCHIVE_COLUMN),
        oid=sql.SQL(archive_oid(archive).sql("postgres")),
        t=source,
    )
    return (
        sql.SQL(
            CREATE_FUNCTION + "{name}() RETURNS TABLE ({c} timestamptz) LANGUAGE sql STABLE "
            "PARALLEL SAFE SECURITY DEFINER ROWS 1 AS {body}"
        )
        .format(
            name=sql.Identifier(naming.INTERNAL_SCHEMA, name),
            c=column,
            body=_dollar_quoted(body.as_string()),
        )
        .as_string()
    )


def archive_oid(archive: exp.Table) -> exp.Expr:
    """pg_catalog.to_regclass('schema.archive'): the partial archive as the table of
    waiting windows keys it (by oid, which stays when ALTER's swap renames the archive;
    NULL once it is dropped)."""
    qualified = sql.Identifier(str(archive.db), archive.name).as_string()
    return exp.Anonymous(this="pg_catalog.to_regclass", expressions=[exp.Literal.string(qualified)])


def create_waiting_trigger(archive: exp.Table) -> str:
    """``CREATE TRIGGER`` on the partial archive ``archive``: every statement adding partial
    rows (a run's commit, a back-fill, a replica's copy, ALTER's reuse of an archive) lists
    their windows in the table of waiting windows, in its own transaction (sql/
    006_waiting_windows.sql holds the function)."""
    return (
        sql.SQL(
            "CREATE TRIGGER {trigger} AFTER INSERT ON {archive} REFERENCING NEW TABLE AS "
            "new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
        .format(
            trigger=sql.Identifier(naming.WAITING_TRIGGER),
            archive=sql.Identifier(str(archive.db), archive.name),
            function=sql.Identifier(naming.INTERNAL_SCHEMA, naming.MARK_WAITING_FUNCTION),
        )
        .as_string()
    )


def unlist_waiting(archive: exp.Table) -> str:
    """The statement that forgets the waiting windows of the partial archive ``archive``,
    before the archive is dropped (its oid could be another table's later)."""
    listed = exp.table_(naming.WAITING_WINDOWS_TABLE, db=naming.INTERNAL_SCHEMA)
    return exp.delete(
        listed,
        where=exp.EQ(
            this=exp.column(naming.WAITING_ARCHIVE_COLUMN), expression=archive_oid(archive)
        ),
    ).sql("postgres")


def function_call(name: str) -> exp.Table:
    """INTERNAL_SCHEMA.``name``() in a FROM clause (``name`` needs no quotes:
    rewriter.naming.serial_live_function, rewriter.naming.waiting_windows_function)."""
    return exp.Table(
        this=exp.Anonymous(this=name, expressions=[]),
        db=exp.to_identifier(naming.INTERNAL_SCHEMA, quoted=True),
    )
