"""Run intake to commit: parse a run's body, spool it durably, compute its partial rows on
Spark and write raw rows, partial rows and the commit marker in one PostgreSQL transaction
(``pipeline``), recording watermarks and late rows on the way (``progress``)."""
