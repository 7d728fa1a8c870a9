"""Archive objects of long stream names get the names Strata now gives them.

PostgreSQL cuts an identifier to 63 bytes without a word. Strata used to spell an archive's
index as the stream name and a suffix, so a stream of 48 to 50 characters got indexes
whose names PostgreSQL had cut ("<stream>__partial_wind"). Strata now shortens such names
itself, to a prefix and a hash of the whole name (rewriter/naming.py). This renames, for
every stream in the catalog, each archive table or index that carries its cut name.

The old and the new rule are frozen here, as they were when this migration was written:
rewriter.naming may change later, this migration must not.

Revision ID: 0008
Revises: 0007
"""

import hashlib

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

CATALOG = "strata_catalog"
INTERNAL = "strata_internal"
MAX_IDENTIFIER = 63
# The archive tables and indexes of a stream: its name and one of these.
SUFFIXES = ("__raw", "__raw_runs", "__partial", "__partial_window", "__serial", "__serial_window")


def _cut(name: str) -> str:
    """The old rule: the whole name, which PostgreSQL cut to 63 bytes."""
    return name.encode()[:MAX_IDENTIFIER].decode(errors="ignore")


def _fitted(name: str) -> str:
    """The new rule: names over 63 bytes become a prefix and 8 hex digits of their SHA-256."""
    encoded = name.encode()
    if len(encoded) <= MAX_IDENTIFIER:
        return name
    digest = hashlib.sha256(encoded).hexdigest()[:8]
    return f"{encoded[: MAX_IDENTIFIER - 9].decode(errors='ignore')}_{digest}"


def _renames() -> list[tuple[str, str]]:
    """(old, new) for every name of every stream that the new rule changes."""
    streams = op.get_bind().execute(sa.text(f"SELECT name FROM {CATALOG}.streams")).scalars()
    pairs = []
    for stream in streams:
        for suffix in SUFFIXES:
            full = stream + suffix
            if _cut(full) != _fitted(full):
                pairs.append((_cut(full), _fitted(full)))
    return pairs


def _rename(old: str, new: str) -> None:
    connection = op.get_bind()
    kind = connection.execute(
        sa.text(
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :schema AND c.relname = :name"
        ),
        {"schema": INTERNAL, "name": old},
    ).scalar()
    if kind is None:  # a stream of another kind, or its objects were never created
        return
    quote = connection.dialect.identifier_preparer.quote_identifier
    statement = "ALTER INDEX" if kind in ("i", "I") else "ALTER TABLE"
    connection.execute(
        sa.text(f"{statement} {quote(INTERNAL)}.{quote(old)} RENAME TO {quote(new)}")
    )


def upgrade() -> None:
    for old, new in _renames():
        _rename(old, new)


def downgrade() -> None:
    for old, new in _renames():
        _rename(new, old)
