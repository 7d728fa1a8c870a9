"""Aggregate streams' views leave out the consolidated rows of windows merged on read with
a filter over the UNION ALL of their two branches, where the first branch (the consolidated
rows read as they are) had it as its WHERE: PostgreSQL flattens a branch without WHERE into
the query and scans the consolidated table as it scans a plain table, which it could not
do for a branch with a WHERE. Each branch carries its window start and whether it is read
as it is under the outputs, for the filter (rewriter/build_views.py view_query), which
passes a row older than the oldest window waiting for the reducer with one comparison.

Plans are re-made from the streams' stored SQL, as at every start, and each aggregate
stream's view replaced: the same columns of the same types, the same rows, so its readers
and the streams built on it keep working. The fold now writes the consolidated tables in
window order, which needs no migration: windows are rewritten in order as they are folded.

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from migrations.plans import replace_views
    from rewriter.plan import ParallelAggregatePlan

    replace_views(ParallelAggregatePlan)


def downgrade() -> None:
    """Views as the previous release makes them: the filter back in the first branch, on
    its own window start, and the branches without the columns it read."""
    from sqlglot import exp

    from migrations.plans import aggregate_view_before_0032, replace_view, stored_plans
    from rewriter import naming
    from rewriter.plan import ParallelAggregatePlan

    driver, plans = stored_plans(ParallelAggregatePlan)
    hidden = (naming.VIEW_WINDOW_COLUMN, naming.VIEW_STORED_COLUMN)
    for name, plan in plans.items():
        view = aggregate_view_before_0032(plan)
        union = view.find(exp.Union)
        where = view.args.get("where")
        if union is None or where is None:  # one row without windows and keys: unchanged
            continue
        for branch in (union.this, union.expression):
            branch.set(
                "expressions", [e for e in branch.expressions if e.alias_or_name not in hidden]
            )
        # NOT (v.stored AND (waiting AND v.window_start >= oldest AND v.window_start IN
        # (...))): waiting and the IN, on the first branch's own window start.
        waiting, touched = where.find(exp.Exists), where.find(exp.In)
        assert waiting is not None and touched is not None
        merged_windows = exp.and_(waiting.copy(), touched.copy())

        def own_window(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.name == naming.VIEW_WINDOW_COLUMN:
                return exp.column(naming.WINDOW_START_COLUMN, table="c")
            return node

        first = union.this.where(exp.Not(this=exp.paren(merged_windows.transform(own_window))))
        union.set("this", first)
        replace_view(driver, name, union)
