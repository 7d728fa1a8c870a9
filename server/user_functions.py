"""The user's SQL functions a new stream calls, read from PostgreSQL's catalog (pg_proc).

A stream's calls of functions sqlglot does not know may be the user's own functions
(created in PostgreSQL, through the SQL port or directly): each one found is read with
its body as PostgreSQL keeps it, and so are the functions its body calls, in turn. The
rewriter inlines them (rewriter.inline_functions) and refuses those it cannot; the catalog
keeps them with the stream, beside the tables it joins (server/catalog.py), so that the
stream plans with the same bodies at every start.
"""

from __future__ import annotations

import sqlalchemy as sa

from rewriter.errors import UnsupportedSQL
from rewriter.inline_functions import called_functions
from rewriter.naming import CATALOG_SCHEMA, INTERNAL_SCHEMA
from rewriter.sql_functions import SqlFunction

# pg_get_function_sqlbody: a SQL-standard body (RETURN ..., BEGIN ATOMIC ... END), which
# PostgreSQL keeps parsed (prosqlbody) and prosrc leaves empty; else AS '...'s text.
_FUNCTIONS = sa.text(
    """
    SELECT p.proname AS name, l.lanname AS language, p.proretset AS returns_set,
           CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable'
                ELSE 'volatile' END AS volatility,
           format_type(p.prorettype, NULL) AS result,
           ARRAY(SELECT format_type(t.oid, NULL)
                 FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS t(oid, k)
                 ORDER BY t.k) AS argument_types,
           coalesce(p.proargnames, ARRAY[]::text[]) AS argument_names,
           CASE WHEN p.prosqlbody IS NOT NULL THEN pg_get_function_sqlbody(p.oid)
                ELSE p.prosrc END AS body
    FROM pg_proc p
    JOIN pg_language l ON l.oid = p.prolang
    JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE p.proname = :name AND p.prokind = 'f' AND pg_function_is_visible(p.oid)
      AND n.nspname NOT IN ('pg_catalog', 'information_schema', :internal, :catalog)
    """
)


def read_functions(connection: sa.Connection, names: list[str]) -> dict[str, SqlFunction]:
    """The user functions among ``names`` (calls of a new stream), and those their bodies
    call, by name; names PostgreSQL has no user function of are left to the rewriter."""
    found: dict[str, SqlFunction] = {}
    waiting = list(names)
    while waiting:
        name = waiting.pop()
        if name in found:
            continue
        rows = connection.execute(
            _FUNCTIONS, {"name": name, "internal": INTERNAL_SCHEMA, "catalog": CATALOG_SCHEMA}
        ).all()
        if not rows:
            continue
        if len(rows) > 1:
            raise UnsupportedSQL(
                f"{name}() has {len(rows)} definitions in PostgreSQL (overloads): Strata "
                "inlines one function of each name; give each definition a name of its own"
            )
        row = rows[0]
        argument_names = list(row.argument_names)[: len(row.argument_types)]
        argument_names += [""] * (len(row.argument_types) - len(argument_names))
        function = SqlFunction(
            name=name,
            arguments=tuple(zip(argument_names, row.argument_types, strict=True)),
            result=row.result,
            language=row.language,
            volatility=row.volatility,
            returns_set=row.returns_set,
            body=row.body or "",
        )
        found[name] = function
        waiting += called_functions(function)
    return found
