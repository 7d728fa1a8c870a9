"""Background workers, all one loop shape (``loop.Worker``): the back-filler, the reducer,
retention, and the serial streams' materializer and repairer. Each step is one bounded,
idempotent transaction; a failing stream is logged and skipped."""
