"""docker-compose.yml and the Dockerfile agree with each other and with Strata's settings.

Docker is not needed: the files are parsed and cross-checked, so a renamed service, a
changed password or a misspelt STRATA_* variable fails here instead of at `compose up`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from server.settings import DEFAULTS, Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
MASTER_PORT = 7077


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]  # type: ignore[no-any-return]


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whether written as a mapping or a list."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return shlex.split(cmd) if isinstance(cmd, str) else [str(part) for part in cmd]


def dockerfile_cmd() -> list[str]:
    """The exec-form CMD of the Dockerfile (the last one wins)."""
    cmds = re.findall(r"^CMD\s+(\[.*\])\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert cmds, "the Dockerfile has no exec-form CMD"
    return yaml.safe_load(cmds[-1])  # type: ignore[no-any-return]


def strata_subcommand(cmd: list[str]) -> list[str]:
    assert cmd[:2] == ["strata", "up"], cmd
    return cmd[2:]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def test_services_exist(services: dict[str, Any]) -> None:
    assert {"postgres", "spark-master", "spark-worker", "strata"} <= set(services)


def test_images(services: dict[str, Any]) -> None:
    assert services["postgres"]["image"].startswith("postgres:16")
    for name in ("spark-master", "spark-worker"):
        assert re.fullmatch(r"(apache/)?spark:4\.0\.1(-python3)?", services[name]["image"])
    assert "build" in services["strata"]


def test_database_url_matches_postgres_service(services: dict[str, Any]) -> None:
    pg_env = environment(services["postgres"])
    url = urlsplit(environment(services["strata"])["STRATA_DATABASE_URL"])
    assert url.scheme in ("postgresql", "postgres")
    assert url.hostname == "postgres" and url.hostname in services
    assert (url.port or 5432) == 5432
    assert url.username == pg_env.get("POSTGRES_USER", "postgres")
    assert url.password == pg_env["POSTGRES_PASSWORD"]
    assert url.path.lstrip("/") == pg_env.get("POSTGRES_DB", url.username)


def test_postgres_has_volume_and_pg_isready_healthcheck(services: dict[str, Any]) -> None:
    postgres = services["postgres"]
    assert any(str(v).endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_spark_master_url_names_the_master_service(services: dict[str, Any]) -> None:
    master_url = environment(services["strata"])["STRATA_SPARK_MASTER"]
    url = urlsplit(master_url)
    assert url.scheme == "spark"
    assert url.hostname == "spark-master" and url.hostname in services
    assert url.port == MASTER_PORT
    master_cmd = command(services["spark-master"])
    assert master_cmd[:2] == [
        "/opt/spark/bin/spark-class",
        "org.apache.spark.deploy.master.Master",
    ]
    assert flag(master_cmd, "--port") in (None, str(MASTER_PORT))
    assert flag(master_cmd, "--host") in (None, "spark-master")
    worker_cmd = command(services["spark-worker"])
    assert worker_cmd[:2] == [
        "/opt/spark/bin/spark-class",
        "org.apache.spark.deploy.worker.Worker",
    ]
    assert worker_cmd[2] == master_url


def test_master_ui_published_on_8081(services: dict[str, Any]) -> None:
    ports = [str(p) for p in services["spark-master"]["ports"]]
    assert "8081:8080" in ports
    assert f"{MASTER_PORT}:{MASTER_PORT}" in ports


def test_strata_env_vars_are_settings(services: dict[str, Any]) -> None:
    fields = set(Settings.model_fields)
    prefix = Settings.model_config["env_prefix"]
    assert prefix == "STRATA_"
    used = [
        (name, key)
        for name, service in services.items()
        for key in environment(service)
        if key.startswith(prefix)
    ]
    assert used, "compose sets no STRATA_* variable"
    unknown = [(name, key) for name, key in used if key[len(prefix) :].lower() not in fields]
    assert not unknown, f"not fields of server.settings.Settings: {unknown}"


def test_strata_waits_for_healthy_dependencies(services: dict[str, Any]) -> None:
    depends = services["strata"]["depends_on"]
    assert depends["postgres"]["condition"] == "service_healthy"
    assert depends["spark-master"]["condition"] in ("service_healthy", "service_started")
    assert "spark-worker" in depends
    assert "healthcheck" in services["spark-master"] or (
        depends["spark-master"]["condition"] == "service_started"
    )
    assert services["spark-worker"]["depends_on"]["spark-master"]["condition"].startswith(
        "service_"
    )


def test_strata_command_and_port(services: dict[str, Any]) -> None:
    strata = services["strata"]
    args = strata_subcommand(command(strata) or dockerfile_cmd())
    assert flag(args, "--host") == "0.0.0.0"
    port = flag(args, "--port") or "8080"
    assert f"{port}:{port}" in [str(p) for p in strata["ports"]]
    data_dir = flag(args, "--data-dir")
    assert data_dir is not None
    assert any(str(v).endswith(f":{data_dir}") for v in strata.get("volumes", []))


def test_strata_sql_port_is_published(services: dict[str, Any]) -> None:
    strata = services["strata"]
    environment = strata["environment"]
    # Beyond loopback: allowed because the compose file names an external PostgreSQL.
    assert environment["STRATA_PG_HOST"] == "0.0.0.0"
    assert environment["STRATA_DATABASE_URL"].startswith("postgresql://")
    port = str(environment.get("STRATA_PG_PORT") or DEFAULTS.pg_port)
    assert f"{port}:{port}" in [str(p) for p in strata["ports"]]


def test_dockerfile_builds_strata(services: dict[str, Any]) -> None:
    text = DOCKERFILE.read_text()
    assert services["strata"]["build"] in (".", {"context": "."})
    assert re.search(r"^FROM python:3\.11", text, re.MULTILINE)
    assert "default-jre-headless" in text
    assert re.search(r"pip install[^\n]* \.(\s|$)", text)
    strata_subcommand(dockerfile_cmd())
    # Everything a non-editable `pip install .` and the migrations need is in the image.
    copied = " ".join(re.findall(r"^COPY\s+(.*)$", text, re.MULTILINE)).split()
    for needed in ("pyproject.toml", "server", "rewriter", "migrations", "sql"):
        assert needed in copied, f"the Dockerfile does not COPY {needed}"


def test_shared_spool_is_mounted_where_executors_run(services: dict[str, Any]) -> None:
    """STRATA_SHARED_SPOOL=true promises that executors see Strata's data dir at the same
    path: the workers must mount the volume the strata service keeps its data dir on."""
    strata = services["strata"]
    if environment(strata).get("STRATA_SHARED_SPOOL", "").lower() not in ("true", "1", "yes"):
        return
    data_dir = flag(strata_subcommand(command(strata) or dockerfile_cmd()), "--data-dir")
    volume = next(str(v).split(":")[0] for v in strata["volumes"] if f":{data_dir}" in str(v))
    mounts = [str(v).split(":")[:2] for v in services["spark-worker"].get("volumes", [])]
    assert [volume, data_dir] in mounts, mounts


def test_the_ha_profile_is_a_cluster_of_three_nodes_that_name_each_other(
    services: dict[str, Any],
) -> None:
    nodes = {name: s for name, s in services.items() if "ha" in (s.get("profiles") or [])}
    assert set(nodes) == {"strata-a", "strata-b", "strata-c"}
    names = {}
    for service, spec in nodes.items():
        env = environment(spec)
        assert all(k.removeprefix("STRATA_").lower() in Settings.model_fields for k in env), env
        assert env["STRATA_DDL_OWNER"] == "a" and env["STRATA_MIN_COPIES"] == "2"
        names[spec["hostname"]] = env["STRATA_NODE"]
        peers = [urlsplit(u).hostname for u in env["STRATA_PEERS"].split(",")]
        assert sorted(peers) == sorted(n for n in nodes if n != service), (service, peers)
        assert strata_subcommand(command(spec))[:2] == ["--host", "0.0.0.0"]
        # Each node its own data (embedded PostgreSQL, spool): no volume shared.
        assert len(spec["volumes"]) == 1 and spec["volumes"][0].startswith(f"{service}-data:")
    assert sorted(names.values()) == ["a", "b", "c"]
    assert (
        len({urlsplit(f"http://x:{s['ports'][0].split(':')[0]}").port for s in nodes.values()}) == 3
    )


def test_the_servers_profile_is_a_second_server_over_the_same_postgresql(
    services: dict[str, Any],
) -> None:
    """docker compose --profile servers: strata-2 beside strata, both over the postgres
    service, both sharing it (STRATA_SHARED_DATABASE), each with its own data volume."""
    first, second = services["strata"], services["strata-2"]
    assert second["profiles"] == ["servers"]
    assert environment(second)["STRATA_DATABASE_URL"] == environment(first)["STRATA_DATABASE_URL"]
    for spec in (first, second):
        assert (
            Settings(
                **{  # type: ignore[arg-type]
                    k.removeprefix("STRATA_").lower(): v for k, v in environment(spec).items()
                }
            ).sharing_problem()
            is None
        )
        assert environment(spec)["STRATA_SHARED_DATABASE"] == "true"
    assert second["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert {str(v).split(":")[0] for v in first["volumes"]}.isdisjoint(
        str(v).split(":")[0] for v in second["volumes"]
    )
    published = {str(p).split(":")[0] for s in services.values() for p in s.get("ports", [])}
    assert len(published) == sum(len(s.get("ports", [])) for s in services.values())
