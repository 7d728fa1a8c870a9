"""One module of routes per resource: streams, runs, info, metrics, health."""
