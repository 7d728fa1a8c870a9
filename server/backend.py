"""The Spark backend: runs the partial queries of plans over batches of runs.

It only executes plans the rewriter made. One long-lived SparkSession is shared; each
thread gets its own child session (``newSession``) so the temporary view holding a
batch's rows never collides between ingestion and back-fill.
"""

from __future__ import annotations

import threading

import pyarrow as pa
from pyspark.sql import SparkSession

from rewriter.naming import RUN_ROWS_VIEW, partial_view, projection_view
from rewriter.plan import DerivedStreamPlan, ProjectionStreamPlan
from server.catalog import ComputedPlan


class SparkBackend:
    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._local = threading.local()
        # Executors of a local master share the driver's disk, so they can read spooled
        # runs straight from their files; a cluster's executors get the rows shipped.
        self.reads_files = (spark.sparkContext.master or "").startswith("local")

    def _session(self) -> SparkSession:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self.spark.newSession()
            self._local.session = session
        return session

    def partials(
        self,
        rows: pa.Table,
        plans: list[ComputedPlan],
        *,
        source: str,
        files: list[str] | None = None,
    ) -> dict[str, pa.Table]:
        """Partial rows of every parallel plan over ``rows``, a batch of runs of the raw
        stream ``source`` (with the run column). Projections in ``plans`` only map the rows
        for the plans after them. ``files``, when given, are Parquet files holding ``rows``.
        """
        aggregates = [p for p in plans if isinstance(p, DerivedStreamPlan)]
        if not aggregates or rows.num_rows == 0:
            return {plan.name: pa.table({}) for plan in aggregates}
        session = self._session()
        if files and self.reads_files:
            frame = session.read.parquet(*files)
        else:
            frame = session.createDataFrame(rows)
        frame.createOrReplaceTempView(RUN_ROWS_VIEW)
        # Plans come in creation order: a roll-up reads the partial rows of the stream below
        # it, an aggregate over a projection reads the projection's rows; both are
        # registered under view names and kept in memory for the batch.
        read_by_others = {p.partial_input for p in aggregates}
        cached = [frame] if len(plans) > 1 else []
        views: list[str] = []
        results: dict[str, pa.Table] = {}
        try:
            for frame_ in cached:
                frame_.cache()
            for plan in plans:
                if isinstance(plan, ProjectionStreamPlan):
                    branch = plan.branch(source)
                    assert branch is not None, f"{plan.name} reads no runs of {source}"
                    output, view = session.sql(branch.spark_query), projection_view(plan.name)
                else:
                    output, view = session.sql(plan.partial_query), partial_view(plan.name)
                if view in read_by_others:
                    output.cache()
                    cached.append(output)
                    output.createOrReplaceTempView(view)
                    views.append(view)
                if isinstance(plan, DerivedStreamPlan):
                    results[plan.name] = output.toArrow()
            return results
        finally:
            for frame_ in cached:
                frame_.unpersist()
            for view in [*views, RUN_ROWS_VIEW]:
                session.catalog.dropTempView(view)
