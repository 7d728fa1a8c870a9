"""The PostgreSQL tables a stream may join: what the rewriter knows of each (its columns and
primary key), and which names of a statement may be tables.

The server reads these from PostgreSQL's catalog when a stream is created and keeps them
with the stream, so that the stream plans the same way at every start, whatever columns the
table gained since (PostgreSQL itself keeps the columns a view uses from changing).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from rewriter.parse_stream import derived_select


@dataclass(frozen=True)
class TableColumn:
    name: str
    pg_type: str  # as PostgreSQL's format_type spells it, e.g. "numeric(10,2)"


@dataclass(frozen=True)
class TableSchema:
    """A table (or view) a user owns in PostgreSQL, under the name the statement uses."""

    name: str  # "campaigns" or "schema.campaigns"
    columns: tuple[TableColumn, ...]
    key: tuple[str, ...] = ()  # the primary key's columns, in key order

    def column(self, name: str) -> TableColumn | None:
        return next((c for c in self.columns if c.name == name), None)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "columns": [[c.name, c.pg_type] for c in self.columns],
            "key": list(self.key),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> TableSchema:
        columns = data["columns"]
        key = data.get("key") or []
        assert isinstance(columns, list) and isinstance(key, list)
        return cls(
            name=str(data["name"]),
            columns=tuple(TableColumn(str(n), str(t)) for n, t in columns),
            key=tuple(str(k) for k in key),
        )


def table_key(node: exp.Table) -> str | None:
    """The name a FROM item gives a table ("name" or "schema.name"); None for a window call
    such as TUMBLE(...)."""
    if not isinstance(node.this, exp.Identifier):
        return None
    if node.args.get("catalog"):
        return None
    schema = node.args.get("db")
    name = _folded(node.this)
    return f"{_folded(schema)}.{name}" if schema is not None else name


def _folded(identifier: exp.Identifier) -> str:
    """PostgreSQL's name for an identifier: folded to lower case unless quoted."""
    return identifier.name if identifier.quoted else identifier.name.lower()


def referenced_names(sql: str) -> list[tuple[str | None, str]]:
    """(schema, name) of every plain relation a CREATE STREAM statement reads: the candidates
    for tables (the server keeps those that are not streams and exist in PostgreSQL)."""
    select = derived_select(sql)
    if select is None:
        return []
    found: dict[tuple[str | None, str], None] = {}
    for node in select.find_all(exp.Table):
        if table_key(node) is None:
            continue
        schema = node.args.get("db")
        found[(_folded(schema) if schema is not None else None, _folded(node.this))] = None
    return list(found)
