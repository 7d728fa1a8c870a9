"""The one place configuration is read: STRATA_* environment variables and CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

# The background workers `strata up` runs (server/workers/, server/sinks/worker.py), by name.
WorkerName = Literal["backfill", "reducer", "retention", "materializer", "repair", "alter", "sink"]
ALL_WORKERS: tuple[WorkerName, ...] = get_args(WorkerName)


class Settings(BaseSettings):
    """Every setting has help text; tests fail if one is undocumented in the README."""

    # hide_input_in_errors: a validation error must not echo a secret's value.
    model_config = SettingsConfigDict(
        env_prefix="STRATA_", extra="ignore", hide_input_in_errors=True
    )

    data_dir: Path = Field(
        Path(".strata"),
        description="Directory for the embedded PostgreSQL, the run spool and Spark scratch files.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(8080, description="Port the HTTP API listens on.")
    pg_host: str = Field(
        "127.0.0.1",
        description="Address the SQL port (PostgreSQL protocol) listens on. Beyond loopback "
        "only with an external PostgreSQL (STRATA_DATABASE_URL).",
    )
    pg_port: int = Field(
        5433,
        description="Port of the SQL port: psql, psycopg and BI tools connect here to run "
        "Strata's statements (CREATE STREAM, COPY and INSERT as runs) and any SQL, which "
        "goes on to PostgreSQL. 0: any free port (strata info says which).",
    )
    database_url: str | None = Field(
        None,
        description="PostgreSQL to use (postgresql://...). Unset: an embedded PostgreSQL in "
        "the data directory.",
    )
    spark_master: str | None = Field(
        None,
        description="Spark master URL (e.g. spark://host:7077). Unset: local Spark in-process.",
    )
    spark_driver_memory: str = Field(
        "1g",
        description="Memory of the Spark driver JVM (its heap's maximum). In local mode the "
        "driver also runs the tasks; raise it for very large back-fill chunks or join batches.",
    )
    shared_spool: bool | None = Field(
        None,
        description="Whether Spark executors see the data directory at the driver's path "
        "(shared storage such as NFS), so that they read spooled runs and back-fill chunks "
        "from their Parquet files; false: the driver ships the rows. Unset: true for local "
        "Spark and for a standalone master on loopback (spark://127.0.0.1:...), else false.",
    )
    batch_max_rows: int = Field(
        1_000_000,
        description="Most rows the backend processes in one Spark job (several runs batched).",
    )
    batch_linger: float = Field(
        0.2,
        ge=0,
        description="Most seconds a batch waits, while other runs are being received, to take "
        "them in too: runs of concurrent clients then share one Spark job. A run alone never "
        "waits; 0: no batch waits.",
    )
    spark_warmup: int = Field(
        40,
        ge=0,
        description="Synthetic batches Spark runs after a start, while no run waits, so that "
        "its JVM has compiled its hot code before runs need it (about 20 s of 2 cores); a run "
        "arriving meanwhile waits at most for the batch in flight. 0: no warm-up.",
    )
    max_run_bytes: int = Field(
        256 * 1024 * 1024, description="Largest run body accepted, in bytes (larger: 413)."
    )
    max_spool_bytes: int = Field(
        4 * 1024 * 1024 * 1024,
        description="Bytes of runs accepted but not yet committed (their spool files) above "
        "which new runs are held back (see STRATA_SPOOL_FULL); 0: no limit.",
    )
    max_spool_seconds: float = Field(
        0.0,
        ge=0,
        description="Most seconds the oldest run in the spool may have waited for its commit "
        "before new runs are held back as by STRATA_MAX_SPOOL_BYTES (see STRATA_SPOOL_FULL): "
        "a bound on how late an accepted run becomes visible while clients post faster "
        "than runs commit; the backlog then waits with the clients (429 and Retry-After), "
        "not in the spool. 0: no bound (the spool's bytes alone limit it).",
    )
    spool_full: Literal["reject", "wait"] = Field(
        "reject",
        description="What a new run meets while the spool is full: reject (429 with "
        "Retry-After) or wait (up to STRATA_SPOOL_FULL_WAIT seconds for room, then 429).",
    )
    spool_full_wait: float = Field(
        30.0, description="Most seconds a run waits for room in a full spool (wait mode)."
    )
    backfill_chunk_rows: int = Field(
        500_000,
        description="Most raw rows a back-fill reads, computes and commits in one chunk.",
    )
    reduce_min_rows: int = Field(
        0,
        description="The reducer moves a pane's partial rows into the consolidated table "
        "once there are more than this many (0: at every pass, so views read reduced "
        "windows like a plain table).",
    )
    reduce_interval: float = Field(
        5.0,
        description="Seconds between reducer passes over the partial archives. A commit "
        "that brings late rows starts a pass at once: the windows it reopened are merged on "
        "read only until that pass has folded them.",
    )
    reduce_concurrency: int = Field(
        2,
        ge=1,
        description="Streams the reducer folds at once, each in its own transaction on its "
        "own connection: a late run that reopened windows of several streams reads at "
        "caught-up speed again about this many times sooner, while as many PostgreSQL "
        "backends write at once.",
    )
    feed_retention: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        description="Seconds the change feed (GET /streams/{name}/changes) keeps each change "
        "of a followed stream: a client may resume from any position this recent; older "
        "ones answer 410 with the oldest position kept (re-sync with snapshot=true).",
    )
    sink_interval: float = Field(
        0.5,
        gt=0,
        description="Seconds between two passes of the sink worker over the sinks (CREATE "
        "SINK) while they have nothing to deliver: how soon a change reaches a sink's target.",
    )
    sink_batch: int = Field(
        1000,
        ge=1,
        description="Most changes a sink delivers in one batch (one transaction in a "
        "PostgreSQL target, one POST to a webhook), unless the sink sets batch_size.",
    )
    sink_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a sink waits to connect to its target or for a webhook's answer "
        "before the attempt counts as failed and is retried.",
    )
    sink_backoff_max: float = Field(
        30.0,
        gt=0,
        description="Most seconds between two attempts of a failing sink: the delay starts at "
        "half a second and doubles with each failure in a row, up to this.",
    )
    serial_interval: float = Field(
        5.0,
        description="Seconds between passes of the workers that write the closed windows of "
        "serial streams to their archives and repair the windows late data changed. A "
        "commit that brings late rows starts a repair at once.",
    )
    workers: Annotated[tuple[WorkerName, ...], NoDecode] = Field(
        ALL_WORKERS,
        description="The background workers to run, comma-separated, from backfill, reducer, "
        "retention, materializer, repair, alter, sink (default: all). A worker left out does "
        "nothing until a later start includes it: views stay exact, archives are just not "
        "compacted, materialized, repaired or back-filled, nor ALTERs swapped in, nor sinks "
        "delivered, meanwhile.",
    )
    shutdown_timeout: float = Field(
        8.0,
        description="Most seconds `strata up` takes to stop after SIGINT or SIGTERM, Spark and "
        "the embedded PostgreSQL included (docker stop waits 10 s before SIGKILL). A batch of "
        "runs that cannot commit within it stays pending and commits at the next start.",
    )
    postgres_linger: float = Field(
        60.0,
        description="Seconds the embedded PostgreSQL keeps running after the last process "
        "using it was killed instead of stopped, for a restart to reuse it; then a watchdog "
        "stops it.",
    )
    run_wait_timeout: float = Field(
        600.0, description="Seconds a ?wait=true ingest request waits for its run to commit."
    )
    node: str | None = Field(
        None,
        description="This node's unique name in a cluster of Strata nodes (high "
        "availability). Unset: a single node, no replication.",
    )
    peers: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        description="The HTTP base URLs (comma-separated) at which this node reaches each "
        "other node of its cluster; they may differ from node to node (e.g. through a proxy).",
    )
    ddl_owner: str | None = Field(
        None,
        description="The name of the node that orders stream DDL (CREATE, ALTER, DROP STREAM) "
        "in a cluster, the same on every node; DDL posted to any other node is forwarded to it. "
        "Required with STRATA_PEERS (as is STRATA_NODE).",
    )
    min_copies: int = Field(
        1,
        ge=1,
        description="A run is acknowledged only once it is durable on this many nodes: 1 "
        "acknowledges it once this node holds it (a disk lost before it is replicated loses "
        "it); 2 loses nothing acknowledged when one node's disk is destroyed.",
    )
    replicate_interval: float = Field(
        0.5,
        gt=0,
        description="Seconds between two pulls of a peer's newly committed runs while it "
        "has none to give.",
    )
    peer_timeout: float = Field(
        5.0,
        gt=0,
        description="Seconds a request to a peer may take (a peer silent for longer counts "
        "as unreachable for that request).",
    )
    shared_database: bool = Field(
        False,
        description="Whether other Strata servers use the same PostgreSQL "
        "(STRATA_DATABASE_URL), behind one load balancer: any of them takes DDL, runs and "
        "reads; each keeps a run's body in PostgreSQL until it is committed, so that another "
        "finishes the runs of a server that died; and each background job runs on one "
        "server at a time, under a lease (STRATA_LEASE_DURATION). Each server keeps its own "
        "data directory. False: this server is alone over its PostgreSQL.",
    )
    lease_duration: float = Field(
        10.0,
        gt=0,
        description="With STRATA_SHARED_DATABASE: seconds a server's heartbeat, and each "
        "background job's lease it holds, last unless renewed (every third of it). A server "
        "that dies (kill -9, a lost machine) has its pending runs and jobs taken over by "
        "another this long after its last heartbeat, plus up to a third of it.",
    )
    # Secrets: SecretStr keeps them out of reprs, tracebacks and logs. Each may instead be
    # read from a file (the same name with _FILE), e.g. a Docker or Kubernetes secret.
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token for every endpoint but /health, with every scope. Unset "
        "(and no scoped token set): the API is open.",
    )
    api_token_file: Path | None = Field(
        None, description="File holding STRATA_API_TOKEN (surrounding whitespace ignored)."
    )
    ddl_token: SecretStr | None = Field(
        None, description="Bearer token that may only create, drop and describe streams."
    )
    ddl_token_file: Path | None = Field(None, description="File holding STRATA_DDL_TOKEN.")
    ingest_token: SecretStr | None = Field(
        None, description="Bearer token that may only post runs and read their status."
    )
    ingest_token_file: Path | None = Field(None, description="File holding STRATA_INGEST_TOKEN.")
    read_token: SecretStr | None = Field(
        None, description="Bearer token that may only describe streams and read run status."
    )
    read_token_file: Path | None = Field(None, description="File holding STRATA_READ_TOKEN.")
    reader_password: SecretStr | None = Field(
        None,
        description="Password of the PostgreSQL role strata_reader (dashboards: SELECT on "
        "the stream views only), applied at every start. Unset: the role cannot log in.",
    )
    reader_password_file: Path | None = Field(
        None, description="File holding STRATA_READER_PASSWORD."
    )

    @field_validator("workers", "peers", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(name.strip() for name in value.split(",") if name.strip())
        return value

    @property
    def clustered(self) -> bool:
        """Whether this node is one of a cluster (it has a name or peers)."""
        return self.node is not None or bool(self.peers)

    def cluster_problem(self) -> str | None:
        """What makes these cluster settings unusable, if anything: with peers, every node
        needs its own name and the same DDL owner (each node its own owner would give the
        same positions to different statements)."""
        if not self.peers:
            return None
        if not self.node:
            return "STRATA_PEERS is set but STRATA_NODE is not: name this node (--node)"
        if not self.ddl_owner:
            return (
                "STRATA_PEERS is set but STRATA_DDL_OWNER is not: name the one node that "
                "orders stream DDL, the same on every node (--ddl-owner)"
            )
        return None

    def sharing_problem(self) -> str | None:
        """What makes STRATA_SHARED_DATABASE unusable here, if anything: servers share a
        PostgreSQL they all reach (not one's embedded one), and a cluster of nodes, each
        with its own PostgreSQL, is another shape."""
        if not self.shared_database:
            return None
        if not self.database_url:
            return (
                "STRATA_SHARED_DATABASE is set but STRATA_DATABASE_URL is not: servers share "
                "an external PostgreSQL, never an embedded one"
            )
        if self.clustered:
            return (
                "STRATA_SHARED_DATABASE and STRATA_NODE/STRATA_PEERS are two shapes: servers "
                "over one PostgreSQL, or nodes each with its own; pick one"
            )
        return None

    @property
    def spool_dir(self) -> Path:
        return self.data_dir / "spool"

    @property
    def postgres_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def spark_dir(self) -> Path:
        return self.data_dir / "spark"

    @property
    def backfill_dir(self) -> Path:
        return self.data_dir / "backfill"


# Every setting's default, without reading the environment: what code that runs without a
# Settings (a test building one worker, a benchmark) falls back to, so that each default is
# written once, above.
DEFAULTS = Settings.model_construct()
