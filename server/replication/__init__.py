"""A cluster of Strata nodes (high availability, seeds/003's replicator of runs): every node
runs the same streams over its own PostgreSQL; runs go to any node and reach every other
by pull (``puller``), stream DDL is ordered by one node (``ddl``), and ``node`` wires them."""
