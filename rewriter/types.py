"""Column types a raw stream may declare, with their PostgreSQL and Spark spellings.

A raw stream declares PostgreSQL types. Spark computes partials over the same
values, so every supported type has one Spark type that holds exactly the same
values (invariant 4). Types outside this table are refused when a stream is created.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from rewriter.errors import UnsupportedSQL

# numeric without a declared precision is held with this precision and scale in
# Spark and validated against it on ingest (Spark decimals stop at 38 digits).
UNBOUNDED_NUMERIC_PRECISION = 38
UNBOUNDED_NUMERIC_SCALE = 10


@dataclass(frozen=True)
class SqlType:
    """A supported column type. ``name`` is PostgreSQL's canonical name."""

    name: str
    precision: int | None = None
    scale: int | None = None

    @property
    def is_integer(self) -> bool:
        return self.name in ("smallint", "integer", "bigint")

    @property
    def is_numeric(self) -> bool:
        return self.name == "numeric"

    @property
    def is_float(self) -> bool:
        return self.name in ("real", "double precision")

    @property
    def is_number(self) -> bool:
        return self.is_integer or self.is_numeric or self.is_float

    @property
    def is_temporal(self) -> bool:
        return self.name in ("timestamptz", "timestamp", "date")

    @property
    def effective_precision(self) -> int:
        """Digits Spark holds for a numeric (the declared ones, or the unbounded default)."""
        return self.precision if self.precision is not None else UNBOUNDED_NUMERIC_PRECISION

    @property
    def effective_scale(self) -> int:
        if self.precision is None:
            return UNBOUNDED_NUMERIC_SCALE
        return self.scale or 0

    def pg(self) -> str:
        if self.name == "numeric" and self.precision is not None:
            return f"numeric({self.precision},{self.scale or 0})"
        return self.name

    def spark(self) -> str:
        if self.name == "numeric":
            return f"decimal({self.effective_precision},{self.effective_scale})"
        return _SPARK_NAMES[self.name]

    def to_sqlglot(self) -> exp.DataType:
        return exp.DataType.build(self.pg(), dialect="postgres")


_SPARK_NAMES = {
    "text": "string",
    "smallint": "smallint",
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "boolean": "boolean",
    "timestamptz": "timestamp",
    "timestamp": "timestamp_ntz",
    "date": "date",
}

_FROM_SQLGLOT: dict[object, str] = {
    exp.DataType.Type.TEXT: "text",
    exp.DataType.Type.VARCHAR: "text",
    exp.DataType.Type.CHAR: "text",
    exp.DataType.Type.SMALLINT: "smallint",
    exp.DataType.Type.INT: "integer",
    exp.DataType.Type.BIGINT: "bigint",
    exp.DataType.Type.DECIMAL: "numeric",
    exp.DataType.Type.FLOAT: "real",
    exp.DataType.Type.DOUBLE: "double precision",
    exp.DataType.Type.BOOLEAN: "boolean",
    exp.DataType.Type.TIMESTAMPTZ: "timestamptz",
    exp.DataType.Type.TIMESTAMP: "timestamp",
    exp.DataType.Type.DATE: "date",
}

SUPPORTED_TYPES = (
    "text, varchar, smallint, integer, bigint, numeric[(p,s)], real, double precision, "
    "boolean, timestamptz, timestamp, date"
)


def sql_type_from_sqlglot(data_type: exp.DataType, *, column: str) -> SqlType:
    """Map a parsed column type onto a supported SqlType, or refuse it by name."""
    name = _FROM_SQLGLOT.get(data_type.this)
    if name is None:
        raise UnsupportedSQL(
            f"column {column!r} has type {data_type.sql('postgres')}, which is not supported; "
            f"supported types: {SUPPORTED_TYPES}"
        )
    if name != "numeric":
        return SqlType(name)
    texts = [p.this.name for p in data_type.expressions]
    if not all(t.isascii() and t.isdigit() and len(t) <= 4 for t in texts) or len(texts) > 2:
        raise UnsupportedSQL(
            f"column {column!r} has type {data_type.sql('postgres')}; write numeric, "
            "numeric(p) or numeric(p,s) with whole numbers, precision 1..38"
        )
    params = [int(t) for t in texts]
    if not params:
        return SqlType("numeric")
    precision = params[0]
    scale = params[1] if len(params) > 1 else 0
    if not 1 <= precision <= 38 or not 0 <= scale <= precision:
        raise UnsupportedSQL(
            f"column {column!r} has type numeric({precision},{scale}); precision must be "
            "1..38 and scale 0..precision (Spark holds at most 38 digits)"
        )
    return SqlType("numeric", precision, scale)


_INT_RANK = {"smallint": 0, "integer": 1, "bigint": 2}

# Decimal digits holding every value of an integer type (exact casts to decimal).
INTEGER_DIGITS = {"smallint": 5, "integer": 10, "bigint": 19}


def promote(left: SqlType, right: SqlType) -> SqlType:
    """PostgreSQL's type for two numbers combined (arithmetic, CASE, greatest())."""
    if left.is_float or right.is_float:
        # PostgreSQL has no float4-with-integer operators that stay float4 in general:
        # anything mixed with a float computes in double precision.
        if left.name == right.name == "real":
            return left
        return SqlType("double precision")
    if left.is_numeric or right.is_numeric:
        return SqlType("numeric")
    return left if _INT_RANK[left.name] >= _INT_RANK[right.name] else right


@dataclass(frozen=True)
class ColumnSpec:
    """A declared column of a raw stream."""

    name: str
    type: SqlType
