"""Sinks: a stream's change feed (server/feed/) delivered to another system, declared in SQL
(CREATE SINK ... FROM stream WITH (connector = ...)) and shown in GET /streams/{name}.

Invariant: every change of the stream reaches the target once, in position order, with no
gap, whatever dies when - Strata, the target, the connection between them:

- the worker (server/sinks/worker.py) reads, for each sink, the changes after the position
  it delivered last, and only moves that position once the target has taken them;
- a PostgreSQL sink (postgres.py) stores its position in the target database in the same
  transaction as the rows: the target holds a batch and its position, or neither;
- a webhook sink (webhook.py) moves its position (in Strata's catalog) after the receiver's
  2xx: a batch whose answer was lost is sent again, and a receiver that stores the last
  position it applied with what it applied skips what it has;
- a Kafka sink (kafka.py) writes a progress record to ``<topic>.strata-progress`` once the
  brokers acknowledged a batch's messages, and resumes from it: a batch cut short is sent
  again, and a consumer that keeps the highest position per key skips what it has;
- a sink whose next changes are no longer kept (STRATA_FEED_RETENTION) stops, ``broken``,
  rather than skip them.

A sink starts with a snapshot: the stream's rows at the position they are current at, which
the target takes in place of what it holds. Ingest never waits for a sink.
"""
