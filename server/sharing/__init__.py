"""Several Strata servers over one PostgreSQL (STRATA_SHARED_DATABASE), behind one load
balancer: any server takes DDL, runs and reads. Three invariants, each kept by one room:

- *An acknowledged run outlives the server that took it* (runs.py). Its record and its
  body (the Parquet bytes of its spool file) are written in one transaction before the
  acknowledgment, the body into PostgreSQL, where every server reaches it. The run belongs
  to that server (runs.owner) while the server's heartbeat is alive; once it has expired,
  the first live server to claim it (one UPDATE whose WHERE names only owners not alive)
  owns it, writes its body into its own spool and commits it. Exactly once rests on the
  commit marker alone (server/ingest/pipeline.py): a run claimed from a server that only
  looked dead is committed by whichever flips it pending->committed first; the other
  writes nothing.
- *Each background job runs on one live server at a time* (membership.py). A worker's pass,
  and each of its steps, runs only while this server holds the job's lease in PostgreSQL,
  renewed every third of STRATA_LEASE_DURATION by one statement that takes a lease only
  from its holder or once it has expired. A server believes its lease for less than it
  lasts in PostgreSQL (counted from before the renewal), so two servers never both believe
  one, short of a process frozen longer than the lease between a check and its step; even
  then each step is one transaction over locked rows (the reducer's per-stream lock, the
  catalog rows a step holds), exact whenever it runs.
- *DDL made on one server is seen by every other at once.* Nothing to keep: every request
  and every worker's pass reads the streams from the catalog in its own transaction
  (server/catalog.py PlanCache.load), and stream DDL serializes on an advisory lock in
  PostgreSQL (catalog.lock_ddl), so no server has a stale copy to invalidate.

A server leaving in good order gives its leases back and removes its heartbeat, so that
the others take its jobs and its pending runs at their next heartbeat, not a lease later.
"""
