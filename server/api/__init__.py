"""The HTTP API (FastAPI): routes per resource, thin handlers over the service, tokens
checked in one dependency, Strata errors mapped to HTTP statuses in one place."""
