"""The Spark backend: runs the partial queries of plans over batches of runs.

It only executes plans the rewriter made. One long-lived SparkSession is shared; each
thread gets its own child session (``newSession``) so the temporary view holding a
batch's rows never collides between ingestion and back-fill.
"""

from __future__ import annotations

import threading

import pyarrow as pa
from pyspark.sql import SparkSession

from rewriter.naming import RUN_ROWS_VIEW, partial_view
from rewriter.plan import DerivedStreamPlan


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
        self, rows: pa.Table, plans: list[DerivedStreamPlan], files: list[str] | None = None
    ) -> dict[str, pa.Table]:
        """Partial rows of every plan over ``rows`` (which carry the run column).

        ``files``, when given, are Parquet files holding exactly ``rows``.
        """
        if not plans or rows.num_rows == 0:
            return {plan.name: pa.table({}) for plan in plans}
        session = self._session()
        if files and self.reads_files:
            frame = session.read.parquet(*files)
        else:
            frame = session.createDataFrame(rows)
        frame.createOrReplaceTempView(RUN_ROWS_VIEW)
        # Plans come in creation order: a roll-up reads the partial rows of the stream below
        # it, registered under that stream's partial view name, so those are kept in memory.
        read_by_others = {p.partial_input for p in plans}
        cached = [frame] if len(plans) > 1 else []
        results: dict[str, pa.Table] = {}
        try:
            for frame_ in cached:
                frame_.cache()
            for plan in plans:
                partial = session.sql(plan.partial_query)
                view = partial_view(plan.name)
                if view in read_by_others:
                    partial.cache()
                    cached.append(partial)
                    partial.createOrReplaceTempView(view)
                results[plan.name] = partial.toArrow()
            return results
        finally:
            for frame_ in cached:
                frame_.unpersist()
            for plan in plans:
                session.catalog.dropTempView(partial_view(plan.name))
            session.catalog.dropTempView(RUN_ROWS_VIEW)
