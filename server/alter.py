"""ALTER STREAM: a stream's query changed exactly, over all history, with its view swapped
in one transaction.

An ALTER builds the new definition beside the stream, as the stream
naming.altering_stream(name), together with every stream built on it (their statements
renamed to read the new one): ordinary streams, which the back-filler fills from the raw
archive while every new run computes partial rows for them, and the view keeps serving
the old definition. Once every one of them has caught up, one transaction (the swap)
drops the old streams and gives the new ones their names, relations and catalog rows
alike, so a reader sees the old definition or the new one, each whole.

Where the archived partial rows answer the new query (rewriter/reuse_partials.py), they
are copied instead of back-filled, and the swap happens in the ALTER's own transaction.
A stream built on the altered one must keep its columns (names and types), or the ALTER
is refused before anything changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import sqlalchemy as sa
from psycopg import sql

from rewriter import rewrite
from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from rewriter.naming import (
    INTERNAL_SCHEMA,
    MAX_ALTERED_NAME,
    PUBLIC_SCHEMA,
    REDUCED_RUN,
    RUN_COLUMN,
    altering_stream,
    consolidated_states_table,
    made_with,
    partial_archive_table,
)
from rewriter.plan import (
    JoinStreamPlan,
    ParallelAggregatePlan,
    RawStreamPlan,
    SerialAggregatePlan,
    StreamPlan,
)
from rewriter.rename import (
    alter_as_create,
    created_relations,
    dropped_functions,
    rename_streams,
    replaced_views,
    stream_name,
)
from rewriter.reuse_partials import reusable_columns
from rewriter.tables import referenced_names
from server import catalog, faults
from server.catalog import PlanCache, StreamRecord
from server.comments import comment_statements
from server.errors import StreamExists, StreamInUse, UnknownStream
from server.workers.reducer import lock_reducer

# Creates the stream of a CREATE STREAM statement (and what it is built on) in the
# caller's transaction: StrataService._create_with_companions.
CreateStream = Callable[[sa.Connection, str], StreamPlan]

BUILDING, DONE = "building", "done"
# The paths: every new stream in place when the ALTER returns, or some back-fill first.
REUSE, BACKFILL = "reuse", "backfill"
# How each new stream gets its history, by kind (a parallel aggregate: "back-fill", "reused
# partial rows" or "no history"; the others are views over their sources).
_HOW: dict[type, str] = {
    ParallelAggregatePlan: "back-fill",
    JoinStreamPlan: "history joined",
    SerialAggregatePlan: "materialized after the swap",
}


@dataclass(frozen=True)
class Member:
    """A stream an ALTER builds: under the name ``built_as`` until the swap, then ``name``."""

    built_as: str
    name: str


@dataclass(frozen=True)
class Alteration:
    stream: str
    version: int
    sql: str
    members: tuple[Member, ...]
    path: str
    state: str

    @property
    def built(self) -> tuple[str, ...]:
        return tuple(m.built_as for m in self.members)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)


def alterations(connection: sa.Connection, *, building_only: bool = True) -> list[Alteration]:
    table = catalog.alters
    query = sa.select(table)
    if building_only:
        query = query.where(table.c.state == BUILDING)
    return [_alteration(row) for row in connection.execute(query.order_by(table.c.started_at))]


def building(connection: sa.Connection, name: str) -> Alteration | None:
    """The ALTER of ``name`` not swapped in yet, if any."""
    table = catalog.alters
    row = connection.execute(
        sa.select(table).where(table.c.stream == name, table.c.state == BUILDING)
    ).first()
    return _alteration(row) if row is not None else None


def _alteration(row: sa.Row) -> Alteration:
    members = tuple(Member(built, name) for built, name in row.members)
    return Alteration(row.stream, row.version, row.sql, members, row.path, row.state)


def family(records: dict[str, StreamRecord], name: str) -> list[str]:
    """``name`` and every stream built on it, directly or not, in creation order."""
    names = [name]
    for record in records.values():
        plan = record.plan
        if isinstance(plan, RawStreamPlan) or record.name in names:
            continue
        if any(d in names for d in plan.dependencies):
            names.append(record.name)
    return names


def guard_create(connection: sa.Connection, plan: StreamPlan) -> None:
    """Refuse a new stream built on a stream an ALTER is rebuilding: the swap would give
    it the new definition without its history."""
    if isinstance(plan, RawStreamPlan):
        return
    for alteration in alterations(connection):
        touched = set(plan.dependencies) & set(alteration.names + alteration.built)
        if touched:
            raise StreamInUse(
                f"stream {sorted(touched)[0]!r} is being rebuilt by ALTER STREAM "
                f"{alteration.stream}; create streams on it once the change is swapped in "
                f"(progress.alter of GET /streams/{alteration.stream})"
            )


def guard_drop(connection: sa.Connection, name: str) -> Alteration | None:
    """The ALTER of ``name`` that its DROP cancels, if any; refuse to drop a stream an
    ALTER of another one is rebuilding or building."""
    for alteration in alterations(connection):
        if alteration.stream == name:
            return alteration
        if name in alteration.names or name in alteration.built:
            raise StreamInUse(
                f"stream {name!r} is part of the pending ALTER STREAM {alteration.stream}; "
                f"wait until it is swapped in, or drop or alter {alteration.stream!r} "
                "(which cancels it)"
            )
    return None


def cancel(connection: sa.Connection, plans: PlanCache, alteration: Alteration) -> None:
    """Drop the streams ``alteration`` built (newest first) and forget it."""
    records = plans.load(connection)
    for name in reversed([n for n in records if n in alteration.built]):
        for statement in records[name].plan.drop_statements:
            catalog.execute_plan_sql(connection, statement)
        catalog.forget_stream_state(connection, name)
        catalog.delete_stream(connection, name)
    connection.execute(
        sa.delete(catalog.alters).where(catalog.alters.c.stream == alteration.stream)
    )


def begin(
    connection: sa.Connection, plans: PlanCache, create: CreateStream, text: str
) -> dict[str, object]:
    """Start ``ALTER STREAM name AS SELECT ...`` (the caller holds the DDL lock): build
    the new definitions, and swap them in at once when no back-fill is needed."""
    create_text = alter_as_create(text)
    name = stream_name(create_text)
    records = plans.load(connection)
    record = records.get(name)
    if record is None:
        raise UnknownStream(f"stream {name!r} does not exist")
    if isinstance(record.plan, RawStreamPlan):
        raise UnsupportedSQL(
            f"stream {name!r} is a raw stream: ALTER STREAM changes a derived stream's query "
            "(a raw stream's columns cannot be changed; create a new raw stream)"
        )
    for pending in alterations(connection):
        if name in pending.built:
            raise StreamInUse(
                f"stream {name!r} is the new definition of {pending.stream!r} being built; "
                f"alter {pending.stream!r} instead"
            )
        if pending.stream == name:  # a newer change replaces the one in flight
            cancel(connection, plans, pending)
            records = plans.load(connection)
        elif name in pending.names:
            raise StreamInUse(
                f"stream {name!r} is being rebuilt by ALTER STREAM {pending.stream}; alter "
                f"it once that change is swapped in (progress.alter of {pending.stream!r})"
            )
    owners = [o for o in records if made_with(o, [name])]
    if owners:
        raise UnsupportedSQL(
            f"stream {name!r} is part of {owners[0]!r} (made with it from its statement): "
            f"alter {owners[0]!r} instead"
        )
    if len(name) > MAX_ALTERED_NAME:
        raise UnsupportedSQL(
            f"stream {name!r} has a name longer than {MAX_ALTERED_NAME} characters, which "
            "ALTER STREAM cannot build beside it: create a new stream instead"
        )
    names = family(records, name)
    for pending in alterations(connection):
        caught = set(names) & set(pending.names + pending.built)
        if pending.stream != name and caught:
            raise StreamInUse(
                f"stream {sorted(caught)[0]!r}, which ALTER STREAM {name} would rebuild, is "
                f"part of the pending ALTER STREAM {pending.stream}; alter {name!r} once "
                "that change is swapped in"
            )
    read = {n for _, n in referenced_names(create_text)} & set(names)
    if read:
        raise InvalidSQL(
            f"the new query of {name!r} reads {sorted(read)[0]!r}, which is {name!r} itself "
            "or built on it"
        )
    renamed = {n: altering_stream(n) for n in names}
    for taken in renamed.values():
        if taken in records:
            raise StreamExists(
                f"stream {taken!r} already exists; ALTER STREAM builds the new definition "
                "under that name: drop or rename it first"
            )
    for n in names:
        statement = create_text if n == name else records[n].sql
        try:
            create(connection, rename_streams(statement, renamed))
        except StrataError as error:
            if n == name:
                raise
            raise StreamInUse(
                f"ALTER STREAM {name} would break the stream {n!r} built on it: {error}; "
                f"drop {n!r} first, or keep the columns it reads"
            ) from None
    built = plans.load(connection)
    members = _members([n for n in built if n not in records], renamed)
    _check_companions(records, members, names)
    _check_shapes(connection, names[1:], renamed)
    path = REUSE
    how: list[dict[str, str]] = []
    for member in members:
        plan = built[member.built_as].plan
        way = _HOW.get(type(plan), "view")
        if isinstance(plan, ParallelAggregatePlan):
            if not _backfilling(connection, member.built_as):
                way = "no history"
            elif _reuse(connection, records.get(member.name), plan):
                way = "reused partial rows"
            else:
                path = BACKFILL
        how.append({"stream": member.name, "how": way})
    if path == BACKFILL:
        _check_retention(built, members)
    version = record.version + 1
    row = {
        "stream": name,
        "version": version,
        "sql": create_text,
        "members": [[m.built_as, m.name] for m in members],
        "path": path,
        "state": BUILDING,
        "started_at": sa.func.now(),
        "swapped_at": None,
    }
    upsert = sa.dialects.postgresql.insert(catalog.alters).values(row)
    connection.execute(
        upsert.on_conflict_do_update(
            index_elements=[catalog.alters.c.stream],
            set_={k: v for k, v in row.items() if k != "stream"},
        )
    )
    state = BUILDING
    if path == REUSE:
        try:
            with connection.begin_nested():
                swap(connection, plans, name)
            state = DONE
        except (sa.exc.OperationalError, psycopg.errors.LockNotAvailable) as error:
            if not gave_way(error):
                raise
            # Readers hold the old streams: the swapper swaps it in at its next pass.
    return {
        "stream": name,
        "version": version,
        "path": path,
        "state": state,
        "building": [m.built_as for m in members] if state == BUILDING else [],
        "rebuilt": names,
        "members": how,
    }


def _check_retention(built: dict[str, StreamRecord], members: list[Member]) -> None:
    """A back-fill reads the raw archives: refuse one whose raw rows retention drops, as
    the new definition would not cover all history."""
    for member in members:
        for source in getattr(built[member.built_as].plan, "raw_sources", ()):
            raw = built[source].plan
            if isinstance(raw, RawStreamPlan) and raw.retention_us:
                raise UnsupportedSQL(
                    f"the new definition of {member.name!r} must be computed from the raw "
                    f"rows of {source!r}, which keeps them only for a while (retention): it "
                    "would not cover all history. Change only what the archived partial rows "
                    "answer (drop or rename columns, add a HAVING, an avg beside its sum and "
                    "count), or create a new stream"
                )


def _members(created: list[str], renamed: dict[str, str]) -> list[Member]:
    """The streams an ALTER created (in creation order) with the names the swap gives
    them: a renamed stream its own, a stream made with one (its join, its subquery) the
    same suffix after the new name."""
    inverse = {built: name for name, built in renamed.items()}
    members = []
    for built in created:
        name = inverse.get(built)
        if name is None:
            owner = next(b for b in inverse if built.startswith(f"{b}__"))
            name = inverse[owner] + built[len(owner) :]
        members.append(Member(built, name))
    return members


def _check_companions(
    records: dict[str, StreamRecord], members: list[Member], names: list[str]
) -> None:
    """A stream made with the new definition takes the name of the old one's: refuse when
    streams other than those rebuilt read the old one."""
    for member in members:
        if member.name in names or member.name not in records:
            continue
        readers = sorted(
            r.name
            for r in records.values()
            if not isinstance(r.plan, RawStreamPlan)
            and member.name in r.plan.dependencies
            and r.name not in names
        )
        if readers:
            raise StreamInUse(
                f"ALTER STREAM would replace {member.name!r}, which {', '.join(readers)} "
                "also read; drop those first"
            )


_VIEW_COLUMNS = sa.text(
    """
    SELECT a.attname, format_type(a.atttypid, a.atttypmod)
      FROM pg_attribute a
     WHERE a.attrelid = CAST(:view AS regclass) AND a.attnum > 0 AND NOT a.attisdropped
     ORDER BY a.attnum
    """
)


def _columns(connection: sa.Connection, name: str) -> list[tuple[str, str]]:
    view = sql.Identifier(PUBLIC_SCHEMA, name).as_string()
    return [(row[0], row[1]) for row in connection.execute(_VIEW_COLUMNS, {"view": view})]


def _check_shapes(
    connection: sa.Connection, dependents: list[str], renamed: dict[str, str]
) -> None:
    """Every stream built on the altered one keeps its columns, names and types."""
    broken = []
    for name in dependents:
        before, after = _columns(connection, name), _columns(connection, renamed[name])
        if before != after:
            changed = sorted({c for c, _ in set(before) ^ set(after)}) or ["(their order)"]
            broken.append(f"{name} ({', '.join(changed)})")
    if broken:
        raise StreamInUse(
            "ALTER STREAM would change the columns of the streams built on it: "
            f"{'; '.join(broken)}; keep the columns they read, or drop them first"
        )


def _backfilling(connection: sa.Connection, name: str) -> bool:
    table = catalog.backfills
    return (
        connection.execute(
            sa.select(sa.func.count()).where(table.c.stream == name, table.c.finished_at.is_(None))
        ).scalar_one()
        > 0
    )


def _reuse(connection: sa.Connection, old: StreamRecord | None, new: StreamPlan) -> bool:
    """Fill the new stream's partial archive from the old one's rows when they answer its
    partial query (under the SHARE locks its creation took on the raw archives, so no run
    commits meanwhile), in place of its back-fill."""
    if old is None:
        return False
    if not isinstance(old.plan, ParallelAggregatePlan) or not isinstance(
        new, ParallelAggregatePlan
    ):
        return False
    columns = reusable_columns(old.plan, new)
    if columns is None:
        return False
    target = sql.Identifier(INTERNAL_SCHEMA, partial_archive_table(new.name))
    names = list(columns)
    archived = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(columns[n]) for n in names),
        sql.Identifier(INTERNAL_SCHEMA, partial_archive_table(old.name)),
    )
    reduced = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(
            sql.Literal(REDUCED_RUN) if columns[n] == RUN_COLUMN else sql.Identifier(columns[n])
            for n in names
        ),
        sql.Identifier(INTERNAL_SCHEMA, consolidated_states_table(old.name)),
    )
    catalog.execute_plan_sql(
        connection,
        sql.SQL("INSERT INTO {} ({}) {} UNION ALL {}").format(
            target, sql.SQL(", ").join(map(sql.Identifier, names)), archived, reduced
        ),
    )
    connection.execute(
        sa.delete(catalog.backfill_runs).where(catalog.backfill_runs.c.stream == new.name)
    )
    connection.execute(
        sa.update(catalog.backfills)
        .where(catalog.backfills.c.stream == new.name)
        .values(total_rows=0, done_rows=0, finished_at=sa.func.now())
    )
    # The windows' counts (strata_window_status) are the old stream's.
    changes = catalog.window_changes
    connection.execute(
        sa.insert(changes).from_select(
            [
                changes.c.stream,
                changes.c.window_start,
                changes.c.rows,
                changes.c.runs,
                changes.c.last_changed_at,
            ],
            sa.select(
                sa.literal(new.name),
                changes.c.window_start,
                changes.c.rows,
                changes.c.runs,
                changes.c.last_changed_at,
            ).where(changes.c.stream == old.name),
        )
    )
    return True


def ready(connection: sa.Connection, alteration: Alteration) -> bool:
    """Whether every stream ``alteration`` built has caught up with the history (a serial
    stream's view is exact before its archive is: it computes the windows not archived
    yet from its source)."""
    table = catalog.backfills
    left = connection.execute(
        sa.select(sa.func.count()).where(
            table.c.stream.in_(alteration.built), table.c.finished_at.is_(None)
        )
    ).scalar_one()
    return left == 0


def swap(connection: sa.Connection, plans: PlanCache, name: str) -> None:
    """Replace the streams the ALTER of ``name`` rebuilds with the ones it built, in the
    caller's transaction (which holds the DDL lock)."""
    row = connection.execute(
        sa.select(catalog.alters).where(catalog.alters.c.stream == name).with_for_update()
    ).one()
    alteration = _alteration(row)
    records = plans.load(connection)
    built = set(alteration.built)
    old = [n for n in records if n in alteration.names and n not in built]
    old += _companions(records, old, built)
    old = [n for n in records if n in old]  # creation order
    sources = sorted(
        {s for n in [*old, *built] for s in getattr(records[n].plan, "raw_sources", ())}
    )
    catalog.lock_raw_archives(connection, sources)  # no run commits meanwhile
    for n in sorted({*old, *built}):  # no fold starts, and the one in flight is done
        lock_reducer(connection, n)
    _lock_relations(connection, [records[n].plan for n in [*old, *built]])
    replaced = records[name]
    connection.execute(
        sa.insert(catalog.stream_history).values(
            stream=name,
            version=replaced.version,
            sql=replaced.sql,
            defined_at=replaced.created_at,
            replaced_at=sa.func.now(),
        )
    )
    for n in reversed(old):
        for statement in records[n].plan.drop_statements:
            catalog.execute_plan_sql(connection, statement)
        catalog.forget_stream_state(connection, n)
        catalog.delete_stream(connection, n)
    current = {n: r.plan for n, r in records.items() if n not in built and n not in old}
    inverse = {m.built_as: m.name for m in alteration.members}
    stored = dict(
        connection.execute(
            sa.select(catalog.streams.c.name, catalog.streams.c.tables).where(
                catalog.streams.c.name.in_(built)
            )
        ).all()
    )
    built_order = [n for n in records if n in built]  # creation order
    for built_as in built_order:
        final = inverse[built_as]
        text = rename_streams(records[built_as].sql, inverse)
        tables = catalog.stored_tables(stored.get(built_as))
        functions = catalog.stored_functions(stored.get(built_as))
        plan = rewrite(text, current, tables, functions)
        _rename_relations(connection, records[built_as].plan, plan)
        if final == name:
            version = alteration.version
        else:
            version = records[final].version if final in records else 1
        catalog.insert_stream(connection, plan, text, tables, functions, version=version)
        catalog.move_stream_state(connection, built_as, final)
        for comment in comment_statements(plan, text):
            catalog.execute_plan_sql(connection, comment)
        current[final] = plan
    for final in [m.name for m in alteration.members]:
        # The views anew: a view's text may name its stream (a serial stream's reads its
        # progress by name), which renaming the view does not change; and the functions
        # they call, named after the stream, made under the final name (the ones named
        # after the built stream go below).
        for statement in replaced_views(current[final]):
            catalog.execute_plan_sql(connection, statement)
    for built_as in reversed(built_order):
        # Its functions, named after it, which no view calls any more.
        for statement in dropped_functions(records[built_as].plan):
            catalog.execute_plan_sql(connection, statement)
        connection.execute(sa.delete(catalog.streams).where(catalog.streams.c.name == built_as))
    catalog.record_windows(connection, current)
    connection.execute(
        sa.update(catalog.alters)
        .where(catalog.alters.c.stream == name)
        .values(state=DONE, swapped_at=sa.func.now())
    )
    faults.reach("alter_swap", [name], members=[m.name for m in alteration.members])


# How long the swap waits for each of its relations: a reader holds its locks until its
# transaction ends, and may ask for one the swap already holds (a deadlock); the swap gives
# way first, and the swapper tries again at its next pass.
SWAP_LOCK_TIMEOUT = "200ms"


def gave_way(error: BaseException) -> bool:
    """Whether ``error`` is the swap giving way to readers (see _lock_relations)."""
    cause = getattr(error, "orig", None) or error
    return isinstance(cause, psycopg.errors.LockNotAvailable)


def _lock_relations(connection: sa.Connection, plans: list[StreamPlan]) -> None:
    """ACCESS EXCLUSIVE locks on every table and view of the streams swapped, before the
    swap changes any: raises psycopg.errors.LockNotAvailable (in an OperationalError) if
    one is not had within SWAP_LOCK_TIMEOUT."""
    names = sorted(
        {
            (r.schema, r.name)
            for plan in plans
            for r in created_relations(plan)
            if r.kind in ("TABLE", "VIEW") and r.schema == INTERNAL_SCHEMA or r.kind == "VIEW"
        }
    )
    if not names:
        return
    catalog.execute_plan_sql(
        connection, sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(SWAP_LOCK_TIMEOUT))
    )
    catalog.execute_plan_sql(
        connection,
        sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
            sql.SQL(", ").join(sql.Identifier(schema, name) for schema, name in names)
        ),
    )
    catalog.execute_plan_sql(connection, "SET LOCAL lock_timeout = 0")


def _companions(records: dict[str, StreamRecord], old: list[str], built: set[str]) -> list[str]:
    """The streams made with the old streams (a join under an aggregate, a subquery) that
    only they read: they go with them."""
    found: list[str] = []
    going = list(old)
    for n in going:  # grows as it goes: a companion's companions go too
        for companion in made_with(n, records):
            if companion in built or companion in going:
                continue
            readers = {
                r.name
                for r in records.values()
                if not isinstance(r.plan, RawStreamPlan) and companion in r.plan.dependencies
            }
            if readers <= set(going):
                found.append(companion)
                going.append(companion)
    return found


def _rename_relations(connection: sa.Connection, built: StreamPlan, final: StreamPlan) -> None:
    """Give the relations of the stream built as ``built`` the names ``final`` (the same
    statement under the stream's own name) has for them."""
    before, after = created_relations(built), created_relations(final)
    if [r.kind for r in before] != [r.kind for r in after]:
        raise AssertionError(f"the plans of {built.name!r} and {final.name!r} differ in shape")
    for old, new in zip(before, after, strict=True):
        if old.name == new.name:
            continue  # shared, e.g. a probe index on a raw archive
        catalog.execute_plan_sql(
            connection,
            sql.SQL("ALTER {} {} RENAME TO {}").format(
                sql.SQL(old.kind), sql.Identifier(old.schema, old.name), sql.Identifier(new.name)
            ),
        )


def progress(connection: sa.Connection, name: str) -> dict[str, object] | None:
    """progress.alter of GET /streams/{name}: the stream's last ALTER."""
    row = connection.execute(
        sa.select(catalog.alters).where(catalog.alters.c.stream == name)
    ).first()
    if row is None:
        return None
    alteration = _alteration(row)
    watched = alteration.built if alteration.state == BUILDING else alteration.names
    table = catalog.backfills
    done, total = connection.execute(
        sa.select(
            sa.func.coalesce(sa.func.sum(table.c.done_rows), 0),
            sa.func.coalesce(sa.func.sum(table.c.total_rows), 0),
        ).where(table.c.stream.in_(watched))
    ).one()
    return {
        "state": alteration.state,
        "version": alteration.version,
        "path": alteration.path,
        "sql": alteration.sql,
        "rebuilt": list(alteration.names),
        "building": list(alteration.built) if alteration.state == BUILDING else [],
        "rows_done": int(done),
        "rows_total": int(total),
        "started_at": row.started_at.isoformat(),
        "swapped_at": row.swapped_at.isoformat() if row.swapped_at else None,
    }


def history(connection: sa.Connection, name: str) -> list[dict[str, object]]:
    """The definitions ``name`` had before its current one, oldest first."""
    table = catalog.stream_history
    rows = connection.execute(
        sa.select(table).where(table.c.stream == name).order_by(table.c.version)
    ).all()
    return [
        {
            "version": r.version,
            "sql": r.sql,
            "defined_at": r.defined_at.isoformat() if r.defined_at else None,
            "replaced_at": r.replaced_at.isoformat(),
        }
        for r in rows
    ]
