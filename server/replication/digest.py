"""The digest of a run's rows: the same rows give the same digest on every node, whatever
their order and however they travelled (a client's body, a peer's Arrow copy), so that the
same run id with other rows is seen for what it is, a conflict."""

from __future__ import annotations

import hashlib
import io

import pyarrow as pa
import pyarrow.csv as pa_csv

from server.ingest.archive import utc_text


def digest(table: pa.Table) -> str:
    """sha256 of the rows as CSV text (zoned timestamps in UTC), sorted by every column."""
    if table.num_rows:
        table = table.sort_by([(name, "ascending") for name in table.column_names])
    buffer = io.BytesIO()
    pa_csv.write_csv(utc_text(table), buffer, pa_csv.WriteOptions(include_header=True))
    return hashlib.sha256(buffer.getvalue()).hexdigest()
