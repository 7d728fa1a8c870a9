"""The engines Strata drives: Spark (session, backend, standalone cluster, Java) and the
embedded PostgreSQL. Nothing here knows about streams' meaning; it starts, stops and runs."""
