"""What Strata's benchmarks share, so that each benchmark module holds only its workload
and its baseline:

* ``errors``: ``BenchError``, the one error a benchmark raises;
* ``results``: the figures a benchmark hands to ``bench/run.py`` (``Result``), the phases
  it prints (``Timing``) and its scales;
* ``percentile``: the one percentile of every figure (nearest rank);
* ``server``: ``strata up`` as a subprocess on free ports, and its stop;
* ``api``: Strata's HTTP API as the benchmarks drive it (streams, runs posted by threads);
* ``data``: generated runs (CSV bodies) and the event-time text of their rows;
* ``lateness``: how generated runs arrive late (profiles, late runs, arrival order);
* ``impressions``: the ad-impression workload (rows, streams, oracles);
* ``nexmark``: the Nexmark-shaped auction workload (auctions, bids, their raw streams);
* ``database``: PostgreSQL: a scratch database, the COPY baseline, timed queries;
* ``sss``: Spark Structured Streaming as a baseline (sinks into PostgreSQL, jobs).
"""
