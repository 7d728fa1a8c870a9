"""Aggregates: the reduce and final forms of stddev/variance, count(DISTINCT), KMV, DDSketch.

Revision ID: 0002
Revises: 0001
"""

from pathlib import Path

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# The SQL this migration ran when it was written, frozen: the migration builds the same
# schema whatever sql/ holds later.
FROZEN_SQL = Path(__file__).resolve().parent / "sql"

# Aggregates first: they depend on the functions.
_AGGREGATES = (
    "strata_moments_merge(numeric[])",
    "strata_moments_merge(double precision[])",
    "strata_set_union(anycompatiblearray)",
    "strata_kmv_union(bigint[])",
    "strata_ddsketch_merge(jsonb)",
)
_FUNCTIONS = (
    "strata_moments_add(numeric[], numeric[])",
    "strata_numeric_variance(numeric[], boolean)",
    "strata_numeric_sqrt_at_scale(numeric)",
    *(
        f"strata_{name}({state})"
        for name in ("var_samp", "var_pop", "stddev_samp", "stddev_pop")
        for state in ("numeric[]", "double precision[]")
    ),
    "strata_array_distinct(anycompatiblearray)",
    "strata_kmv_add(bigint[], bigint[])",
    "strata_kmv_estimate(bigint[])",
    "strata_ddsketch_bucket(double precision)",
    "strata_ddsketch_value(integer)",
    "strata_ddsketch_add(jsonb, jsonb)",
    "strata_ddsketch_quantile(jsonb, double precision)",
)


def upgrade() -> None:
    op.execute((FROZEN_SQL / "0002_aggregates.sql").read_text())


def downgrade() -> None:
    for aggregate in _AGGREGATES:
        op.execute(f"DROP AGGREGATE IF EXISTS public.{aggregate}")
    for function in _FUNCTIONS:
        op.execute(f"DROP FUNCTION IF EXISTS public.{function}")
