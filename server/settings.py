"""The one place configuration is read: STRATA_* environment variables and CLI flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting has help text; tests fail if one is undocumented in the README."""

    model_config = SettingsConfigDict(env_prefix="STRATA_", extra="ignore")

    data_dir: Path = Field(
        Path(".strata"),
        description="Directory for the embedded PostgreSQL, the run spool and Spark scratch files.",
    )
    host: str = Field("127.0.0.1", description="Address the HTTP API listens on.")
    port: int = Field(8080, description="Port the HTTP API listens on.")
    database_url: str | None = Field(
        None,
        description="PostgreSQL to use (postgresql://...). Unset: an embedded PostgreSQL in "
        "the data directory.",
    )
    spark_master: str | None = Field(
        None,
        description="Spark master URL (e.g. spark://host:7077). Unset: local Spark in-process.",
    )
    spark_driver_memory: str = Field("2g", description="Memory of the Spark driver JVM.")
    batch_max_rows: int = Field(
        1_000_000,
        description="Most rows the backend processes in one Spark job (several runs batched).",
    )
    max_run_bytes: int = Field(
        256 * 1024 * 1024, description="Largest run body accepted, in bytes (larger: 413)."
    )
    backfill_chunk_rows: int = Field(
        500_000,
        description="Most raw rows a back-fill reads, computes and commits in one chunk.",
    )
    reduce_min_rows: int = Field(
        4,
        description="The reducer folds a window's partial rows for a group once there are "
        "more than this many.",
    )
    reduce_interval: float = Field(
        5.0, description="Seconds between reducer passes over the partial archives."
    )
    run_wait_timeout: float = Field(
        600.0, description="Seconds a ?wait=true ingest request waits for its run to commit."
    )

    @property
    def spool_dir(self) -> Path:
        return self.data_dir / "spool"

    @property
    def postgres_dir(self) -> Path:
        return self.data_dir / "postgres"

    @property
    def spark_dir(self) -> Path:
        return self.data_dir / "spark"
