"""What the migrations that carry streams forward share: each stream's plan as today's
rewriter makes it from the stream's stored SQL (as at every start), and the database
connection to run a plan's statements on, straight through psycopg without parameters (a
plan's SQL may hold a '%')."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from alembic import op

if TYPE_CHECKING:
    import psycopg
    from sqlglot import exp

    from rewriter.plan import ParallelAggregatePlan, SerialAggregatePlan, StreamPlan

Plan = TypeVar("Plan", bound="StreamPlan")


def stored_plans(kind: type[Plan]) -> tuple[psycopg.Connection, dict[str, Plan]]:
    """The migration's psycopg connection, and the plans of the streams of ``kind`` by
    name (for migrations after 0015, whose catalog has stream versions)."""
    from server.catalog import PlanCache

    connection = op.get_bind()
    driver = connection.connection.driver_connection
    assert driver is not None
    records = PlanCache().load(connection)
    return driver, {n: r.plan for n, r in records.items() if isinstance(r.plan, kind)}


def replace_views(kind: type[StreamPlan]) -> None:
    """Replace the view of every stream of ``kind`` with today's, after the functions it
    calls (rewriter.rename.replaced_views): the same columns of the same types, so that its
    readers and the streams built on it keep working."""
    from rewriter.rename import replaced_views

    driver, plans = stored_plans(kind)
    for plan in plans.values():
        if not view_tables_made(driver, plan):
            continue
        for statement in replaced_views(plan):
            driver.execute(statement)


def view_tables_made(driver: psycopg.Connection, plan: StreamPlan) -> bool:
    """Whether the tables ``plan``'s view reads exist: a top-N stream that today's rewriter
    keeps as a serial stream has its archive only from 0026 on, an aggregate joined with
    tables on read its joined rows only from 0029 on, and the migrations before leave its
    view (ranked, or joined, on read) as it is."""
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan, SerialAggregatePlan

    if isinstance(plan, SerialAggregatePlan):
        made = naming.serial_archive_table(plan.name)
    elif isinstance(plan, ParallelAggregatePlan) and plan.joined is not None:
        made = naming.joined_seen_table(plan.name)
    else:
        return True
    return relation_exists(driver, made)


def relation_exists(driver: psycopg.Connection, name: str) -> bool:
    """Whether INTERNAL_SCHEMA.``name`` exists."""
    from rewriter import naming

    found = driver.execute(
        "SELECT to_regclass(%s)", (f"{naming.INTERNAL_SCHEMA}.{name}",)
    ).fetchone()
    return found is not None and found[0] is not None


def index_statements(plan: StreamPlan) -> list[exp.Create]:
    """``plan``'s CREATE INDEX statements, to run again (IF NOT EXISTS) or to name what
    a downgrade drops."""
    return create_statements(plan, "INDEX")


def create_statements(plan: StreamPlan, *kinds: str) -> list[exp.Create]:
    """``plan``'s CREATE statements of ``kinds`` (TABLE, INDEX, ...), in order; its function
    statements, which sqlglot does not read, skipped."""
    import sqlglot
    from sqlglot import exp

    from rewriter.ddl import CREATE_FUNCTION

    creates = []
    for statement in plan.create_statements:
        if statement.startswith(CREATE_FUNCTION):
            continue
        create = sqlglot.parse_one(statement, read="postgres")
        if isinstance(create, exp.Create) and create.kind in kinds:
            creates.append(create)
    return creates


def replace_calls(
    driver: psycopg.Connection, name: str, view_query: str, function: str, query: exp.Query
) -> None:
    """Replace the view ``name`` with ``view_query``, each call of INTERNAL_SCHEMA.
    ``function``() in its FROM clauses replaced by ``query`` under the call's alias, and
    drop the function: how a downgrade gives the previous release a view it can serve (and
    drop) from today's plan."""
    import sqlglot
    from psycopg import sql
    from sqlglot import exp

    from rewriter import naming

    view = sqlglot.parse_one(view_query, read="postgres")
    for call in list(view.find_all(exp.Table)):
        if isinstance(call.this, exp.Anonymous) and call.this.name.lower() == function:
            call.replace(query.subquery(call.alias_or_name))
    replace_view(driver, name, view)
    driver.execute(
        sql.SQL("DROP FUNCTION IF EXISTS {}()").format(
            sql.Identifier(naming.INTERNAL_SCHEMA, function)
        )
    )


def replace_view(driver: psycopg.Connection, name: str, query: exp.Query) -> None:
    """CREATE OR REPLACE the stream ``name``'s view as ``query``."""
    from sqlglot import exp

    from rewriter import naming

    create = exp.Create(
        this=exp.table_(name, db=naming.PUBLIC_SCHEMA, quoted=True),
        kind="VIEW",
        expression=query,
        replace=True,
    )
    driver.execute(create.sql("postgres"))


def serial_view_before_0031(plan: SerialAggregatePlan) -> exp.Query:
    """The serial stream ``plan``'s view as releases before 0031 made it: its archive's
    rows, and the rows of one function that computed every window read on read (today's
    function of the windows not materialized yet, under the same name), where today's view
    joins each function's rows with the windows listed."""
    import sqlglot
    from sqlglot import exp

    from rewriter import naming
    from rewriter.ddl import function_call

    view = sqlglot.parse_one(plan.view_query, read="postgres")
    branches = view if isinstance(view, exp.Union) else view.find(exp.Union)
    assert branches is not None
    archived = branches
    while isinstance(archived, exp.Union):
        archived = archived.this
    assert isinstance(archived, exp.Select)
    columns = [exp.column(e.alias_or_name, quoted=True) for e in archived.expressions]
    live = exp.alias_(function_call(naming.serial_live_function(plan.name)), "live", table=True)
    before = exp.union(archived.copy(), exp.select(*columns).from_(live), distinct=False)
    if branches is view:
        return before
    branches.replace(before)
    assert isinstance(view, exp.Query)
    return view


def function_body(driver: psycopg.Connection, function: str) -> exp.Query | None:
    """The query the function INTERNAL_SCHEMA.``function`` runs (a plan's function of rows
    computed on read), None when there is no such function."""
    import sqlglot
    from sqlglot import exp

    from rewriter import naming

    found = driver.execute(
        "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = %s",
        (naming.INTERNAL_SCHEMA, function),
    ).fetchone()
    if found is None:
        return None
    body = sqlglot.parse_one(found[0], read="postgres")
    assert isinstance(body, exp.Query)
    return body


def aggregate_view_before_0032(plan: ParallelAggregatePlan) -> exp.Query:
    """The aggregate stream ``plan``'s view query as releases before 0032 made it: the
    partial rows and states of the waiting windows read from their tables, not window by
    window from the list of waiting windows (each SELECT that joins a table to the stream's
    function of waiting windows, as ``w``: the table alone, the window start its own; the
    states still only of the listed windows, by IN, as then). A view without them is
    returned as it is."""
    import sqlglot
    from sqlglot import exp

    from rewriter import naming

    waiting = naming.waiting_windows_function(plan.name)
    view = sqlglot.parse_one(plan.view_query, read="postgres")
    for select in list(view.find_all(exp.Select)):
        source = select.args.get("from_")
        joins = select.args.get("joins") or []
        listed = source.this if source is not None else None
        if not (
            isinstance(listed, exp.Table)
            and isinstance(listed.this, exp.Anonymous)
            and listed.this.name.lower() == waiting
            and listed.alias == "w"
            and len(joins) == 1
        ):
            continue
        rows = joins[0].this
        alias = rows.alias
        for column in select.find_all(exp.Column):
            if column.table == "w":
                column.set("table", exp.to_identifier(alias))
        select.set("from_", exp.From(this=rows.copy()))
        select.set("joins", None)
        if alias == "u":  # the partial rows: every one waits
            select.set("where", None)
            continue
        start = naming.WINDOW_START_COLUMN
        in_list = exp.In(
            this=exp.column(start, table=alias),
            query=exp.select(exp.column(start, table="w")).from_(listed.copy()).subquery(),
        )
        where = select.args.get("where")
        select.set("where", exp.Where(this=exp.and_(where.this, in_list) if where else in_list))
    assert isinstance(view, exp.Query)
    return view
