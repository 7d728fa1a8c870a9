"""Authentication and roles: API tokens and scopes, the dashboard role strata_reader, and
secrets kept out of logs. Real PostgreSQL, real Spark, real server."""

from __future__ import annotations

import hmac
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from psycopg import sql
from pydantic import ValidationError

from rewriter import naming
from server import security
from server.api.app import create_app
from server.catalog import MIGRATIONS_DIR, create_catalog_engine, migrate
from server.engines.embedded_pg import EmbeddedPostgres
from server.errors import ReaderRoleError, SecretSettingError
from server.net import free_port
from server.security import READER_ROLE, Scope, Tokens, configure_reader, redacted_url
from server.settings import Settings
from tests.conftest import Strata, new_database

IMPSNS = (
    "CREATE STREAM impsns (campaign text, user_id bigint, price numeric(12,4), t timestamptz) "
    "WITH (event_time = 't')"
)
COUNT = (
    "CREATE STREAM impsn_count AS SELECT campaign, count(*) AS c, window_end AS t "
    "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end"
)
# A serial stream (MAX over COUNT): its view calls strata_serial_until/_corrected.
TOP = (
    "CREATE STREAM impsn_top AS SELECT max(c) AS top, window_end AS t "
    "FROM TUMBLE(impsn_count, t, INTERVAL '1 minute') GROUP BY window_end"
)
ROWS = (
    '{"campaign": "a", "user_id": 1, "price": 1.5, "t": "2024-01-01T00:00:10Z"}\n'
    '{"campaign": "a", "user_id": 2, "price": 2.25, "t": "2024-01-01T00:00:50Z"}\n'
    '{"campaign": "b", "user_id": 3, "price": 3, "t": "2024-01-01T00:01:10Z"}\n'
)
NDJSON = {"content-type": "application/x-ndjson"}
TOKENS = {"api": "api-7Qe2", "ddl": "ddl-Xk91", "ingest": "ingest-Mb40", "read": "read-Zt63"}
EMBEDDED = not os.environ.get("STRATA_TEST_DATABASE_URL")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@contextmanager
def api(strata: Strata, tmp_path: Path, **secrets: object) -> Iterator[TestClient]:
    """Strata's HTTP API over the fixture's service, with these secret settings."""
    settings = Settings.model_validate({"data_dir": tmp_path, "run_wait_timeout": 120, **secrets})
    app = create_app(strata.service, settings, {"database_url": strata.database_url})
    with TestClient(app) as client:
        yield client


def scoped(strata: Strata, tmp_path: Path) -> AbstractContextManager[TestClient]:
    return api(
        strata,
        tmp_path,
        api_token=TOKENS["api"],
        ddl_token=TOKENS["ddl"],
        ingest_token=TOKENS["ingest"],
        read_token=TOKENS["read"],
    )


def endpoints(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path) the API documents, path parameters filled in."""
    found: list[tuple[str, str]] = []
    for path, operations in client.get("/openapi.json").json()["paths"].items():
        concrete = path.replace("{name}", "impsns").replace("{run_id}", "r1")
        found.extend((method.upper(), concrete) for method in operations)
    return found


# -- tokens -------------------------------------------------------------------------------


def test_without_tokens_everything_is_open(strata: Strata, tmp_path: Path) -> None:
    with api(strata, tmp_path) as client:
        assert client.post("/streams", json={"sql": IMPSNS}).status_code == 201
        for headers in ({}, bearer("anything")):
            assert client.get("/streams", headers=headers).status_code == 200
            assert client.get("/info", headers=headers).json()["database_url"]
        response = client.post(
            "/streams/impsns/runs?wait=true&run_id=open", content=ROWS, headers=NDJSON
        )
        assert response.status_code == 200
        assert response.json() == {"run_id": "open", "status": "committed", "rows": 3}
    assert strata.query("SELECT count(*) FROM impsns") == [(3,)]


def test_every_endpoint_but_health_needs_the_token(strata: Strata, tmp_path: Path) -> None:
    strata.create(IMPSNS)
    strata.ingest("impsns", ROWS, run_id="r1")
    with api(strata, tmp_path, api_token=TOKENS["api"]) as client:
        routes = endpoints(client)
        # Not vacuous: the contract's endpoints are all there.
        assert {("POST", "/streams"), ("DELETE", "/streams/impsns")} <= set(routes)
        assert {("POST", "/streams/impsns/runs"), ("GET", "/runs/r1")} <= set(routes)
        assert ("GET", "/info") in routes
        for method, path in routes:
            if path == "/health":
                assert client.request(method, path).json() == {"status": "ok"}
                continue
            for headers in (
                {},
                bearer("wrong"),
                bearer(TOKENS["api"] + "x"),
                bearer(TOKENS["api"][:-1]),
                {"Authorization": f"Basic {TOKENS['api']}"},
                {"Authorization": TOKENS["api"]},
            ):
                response = client.request(method, path, headers=headers, json={"sql": IMPSNS})
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                assert "error" in response.json()
        # A body FastAPI cannot parse is refused for the token first, then for the body.
        garbage = {"content-type": "application/json"}
        assert client.post("/streams", content=b"{", headers=garbage).status_code == 401
        response = client.post("/streams", content=b"{", headers=garbage | bearer(TOKENS["api"]))
        assert response.status_code == 400 and "JSON" in response.json()["error"], response.text
        # Nothing of all that happened.
        assert strata.query("SELECT count(*) FROM impsns") == [(3,)]
        assert [s["name"] for s in strata.client.get("/streams").json()] == ["impsns"]
        # The documentation pages stay readable (they hold no data).
        assert client.get("/docs").status_code == 200


def test_the_right_token_works(strata: Strata, tmp_path: Path) -> None:
    with api(strata, tmp_path, api_token=TOKENS["api"]) as client:
        auth = bearer(TOKENS["api"])
        assert client.post("/streams", json={"sql": IMPSNS}, headers=auth).status_code == 201
        response = client.post(
            "/streams/impsns/runs?wait=true&run_id=r1", content=ROWS, headers=NDJSON | auth
        )
        assert response.json() == {"run_id": "r1", "status": "committed", "rows": 3}
        assert client.get("/runs/r1", headers=auth).json()["status"] == "committed"
        assert client.get("/streams/impsns", headers=auth).json()["name"] == "impsns"
        assert [s["name"] for s in client.get("/streams", headers=auth).json()] == ["impsns"]
        info = client.get("/info", headers=auth).json()
        assert info["database_url"] == strata.database_url
        # The scheme is case-insensitive (RFC 7235).
        lower = {"Authorization": f"bearer {TOKENS['api']}"}
        assert client.get("/streams", headers=lower).status_code == 200
        assert client.delete("/streams/impsns", headers=auth).status_code == 200


def test_scoped_tokens(strata: Strata, tmp_path: Path) -> None:
    strata.create(IMPSNS)
    strata.ingest("impsns", ROWS, run_id="r1")
    may = {
        "api": {"list", "describe", "run status", "info", "create", "drop", "ingest"},
        "ddl": {"list", "describe", "create", "drop"},
        "ingest": {"run status", "ingest"},
        "read": {"list", "describe", "run status"},
    }
    with scoped(strata, tmp_path) as client:
        for kind, token in TOKENS.items():
            auth = bearer(token)
            victim = f"victim_{kind}"
            strata.create(f"CREATE STREAM {victim} (t timestamptz) WITH (event_time = 't')")
            calls = {
                "list": client.get("/streams", headers=auth),
                "describe": client.get("/streams/impsns", headers=auth),
                "run status": client.get("/runs/r1", headers=auth),
                "info": client.get("/info", headers=auth),
                "create": client.post(
                    "/streams",
                    json={"sql": f"CREATE STREAM new_{kind} (t timestamptz) WITH (event_time='t')"},
                    headers=auth,
                ),
                "drop": client.delete(f"/streams/{victim}", headers=auth),
                "ingest": client.post(
                    f"/streams/impsns/runs?wait=true&run_id=by_{kind}",
                    content=ROWS,
                    headers=NDJSON | auth,
                ),
            }
            for action, response in calls.items():
                if action in may[kind]:
                    assert response.status_code < 300, (kind, action, response.text)
                    if action == "ingest":
                        assert response.json() == {
                            "run_id": f"by_{kind}",
                            "status": "committed",
                            "rows": 3,
                        }
                else:
                    assert response.status_code == 403, (kind, action, response.text)
                    assert "scope" in response.json()["error"]
            # What a token may not do left no trace.
            exists = {s["name"] for s in strata.client.get("/streams").json()}
            assert (f"new_{kind}" in exists) == ("create" in may[kind])
            assert (victim in exists) == ("drop" not in may[kind])
            ran = strata.client.get(f"/runs/by_{kind}").status_code == 200
            assert ran == ("ingest" in may[kind])
    # r1's rows and those of the two tokens that may ingest (api, ingest), nothing more.
    assert strata.query("SELECT count(*) FROM impsns") == [(9,)]


def test_token_files(strata: Strata, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKENS["api"] + "\n")
    read_file = tmp_path / "read"
    read_file.write_text(f"  {TOKENS['read']}\r\n")
    with api(strata, tmp_path, api_token_file=token_file, read_token_file=read_file) as client:
        assert client.get("/info").status_code == 401
        assert client.get("/info", headers=bearer(TOKENS["api"])).status_code == 200
        assert client.get("/streams", headers=bearer(TOKENS["read"])).status_code == 200
        assert client.get("/info", headers=bearer(TOKENS["read"])).status_code == 403
    empty = tmp_path / "empty"
    empty.write_text("\n")
    problems: dict[str, dict[str, object]] = {
        "STRATA_API_TOKEN or STRATA_API_TOKEN_FILE, not both": {
            "api_token": TOKENS["api"],
            "api_token_file": token_file,
        },
        "STRATA_DDL_TOKEN_FILE: ": {"ddl_token_file": empty},
        "STRATA_INGEST_TOKEN_FILE: cannot read": {"ingest_token_file": tmp_path / "missing"},
    }
    for message, settings in problems.items():
        with (
            pytest.raises(SecretSettingError, match=message) as raised,
            api(strata, tmp_path, **settings),
        ):
            pass
        assert TOKENS["api"] not in str(raised.value)


def test_strata_up_refuses_a_missing_token_file_before_starting(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env["STRATA_API_TOKEN_FILE"] = str(tmp_path / "missing")
    result = subprocess.run(
        [
            *(sys.executable, "-m", "server.cli", "up", "--pg-port", "0"),
            *("--data-dir", str(tmp_path / "data")),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "STRATA_API_TOKEN_FILE" in result.stderr
    assert not (tmp_path / "data" / "postgres").exists()


def test_tokens_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[int, int]] = []
    original = hmac.compare_digest

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return original(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", compare_digest)
    tokens = Tokens.from_settings(
        Settings.model_validate({f"{k}_token": v for k, v in TOKENS.items()})
    )
    for presented in (TOKENS["api"], TOKENS["read"], "x", TOKENS["api"][:3], "y" * 1000):
        compared.clear()
        tokens.scopes_of(presented)
        # Every configured token is compared (no early exit on a match or a mismatch), and
        # always as fixed-length digests, so neither position nor length shows in timing.
        assert compared == [(32, 32)] * len(TOKENS)
    assert tokens.scopes_of(TOKENS["api"]) == frozenset(Scope)
    assert tokens.scopes_of(TOKENS["ingest"]) == {Scope.INGEST}
    assert tokens.scopes_of(TOKENS["api"] + " ") is None


def test_openapi_shows_the_bearer_scheme(strata: Strata, tmp_path: Path) -> None:
    with api(strata, tmp_path, api_token=TOKENS["api"]) as client:
        schema = client.get("/openapi.json").json()
    schemes = schema["components"]["securitySchemes"]
    assert [s["scheme"] for s in schemes.values()] == ["bearer"]
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            assert ("security" in operation) == (path != "/health"), path


def test_settings_never_show_secrets(tmp_path: Path) -> None:
    settings = Settings.model_validate({"api_token": TOKENS["api"], "reader_password": "pw-9x"})
    assert TOKENS["api"] not in repr(settings) and "pw-9x" not in str(settings)
    with pytest.raises(ValidationError) as raised:
        Settings.model_validate({"api_token": TOKENS["api"], "port": "not-" + TOKENS["read"]})
    assert TOKENS["read"] not in str(raised.value)
    assert redacted_url("postgresql://u:s3cr%40t@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redacted_url("postgresql://h/db?sslmode=require&password=s3") == (
        "postgresql://h/db?sslmode=require&password=***"
    )
    assert redacted_url("postgresql://postgres@127.0.0.1:5432/strata") == (
        "postgresql://postgres@127.0.0.1:5432/strata"
    )
    assert redacted_url("postgresql://postgres:Ab-9_x@127.0.0.1:5432/strata") == (
        "postgresql://postgres:***@127.0.0.1:5432/strata"
    )


# -- the dashboard role -------------------------------------------------------------------


def as_role(url: str, user: str, password: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))


def as_owner(strata: Strata, statements: str) -> None:
    with psycopg.connect(strata.database_url, autocommit=True) as owner:
        owner.execute(statements.encode())


def test_reader_reads_the_stream_views_and_nothing_else(strata: Strata) -> None:
    strata.create(IMPSNS)
    strata.create(COUNT)
    top = strata.create(TOP)
    assert top["parallelism"] == "SP"
    strata.ingest("impsns", ROWS)
    configure_reader(strata.service.engine, "reader-pw-1")
    # A table of the owner's own in public, as the dimension tables streams join will be.
    as_owner(
        strata,
        "CREATE TABLE public.campaign_budgets (campaign text, budget numeric);"
        "CREATE VIEW public.big_budgets AS SELECT * FROM campaign_budgets WHERE budget > 10;"
        "INSERT INTO campaign_budgets VALUES ('a', 100)",
    )
    internal = strata.query(
        "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables "
        "WHERE schemaname IN ('strata_internal', 'strata_catalog')"
    )
    assert len(internal) > 5
    owners = ["public.campaign_budgets", "public.big_budgets"]
    with psycopg.connect(
        as_role(strata.database_url, READER_ROLE, "reader-pw-1"), autocommit=True
    ) as reader:
        assert reader.execute("SELECT current_user").fetchone() == (READER_ROLE,)
        assert reader.execute("SELECT count(*) FROM impsns").fetchone() == (3,)
        assert reader.execute("SELECT sum(c) FROM impsn_count").fetchone() == (3,)
        assert reader.execute("SELECT max(top) FROM impsn_top").fetchone() == (2,)
        # The functions serial views call read the catalog for the reader.
        reader.execute("SELECT strata_serial_until('impsn_top'), strata_serial_corrected('x')")
        denied = [f"SELECT * FROM {table}" for (table,) in internal + [(t,) for t in owners]] + [
            "INSERT INTO impsns (campaign, t) VALUES ('x', now())",
            "UPDATE impsns SET campaign = 'x'",
            "DELETE FROM impsns",
            "TRUNCATE strata_internal.impsns__raw",
            # The serial view's function, which runs as its owner, called by name.
            f"SELECT * FROM strata_internal.{naming.serial_live_function('impsn_top')}()",
            f"SELECT * FROM strata_internal.{naming.serial_awaiting_function('impsn_top')}()",
            # The function an aggregate view finds the windows that wait with, the same.
            f"SELECT * FROM strata_internal.{naming.waiting_windows_function('impsn_count')}()",
            "CREATE TABLE public.mine (x int)",
            "CREATE VIEW public.mine AS SELECT 1",
            "CREATE FUNCTION public.mine() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "CREATE TABLE strata_internal.mine (x int)",
            "CREATE SCHEMA mine",
            "DROP VIEW impsn_count",
            "ALTER VIEW impsns RENAME TO mine",
        ]
        for statement in denied:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute(statement)
                pytest.fail(f"the reader could: {statement}")
    # A stream created later is readable too (granted as it is created); an owner's table
    # once its owner grants it.
    strata.create("CREATE STREAM later (t timestamptz) WITH (event_time = 't')")
    as_owner(strata, f"GRANT SELECT ON campaign_budgets TO {READER_ROLE}")
    as_owner(strata, "CREATE TABLE public.created_after (x int)")
    with psycopg.connect(
        as_role(strata.database_url, READER_ROLE, "reader-pw-1"), autocommit=True
    ) as reader:
        assert reader.execute("SELECT count(*) FROM later").fetchone() == (0,)
        assert reader.execute("SELECT budget FROM campaign_budgets").fetchone() == (100,)
        for table in ("big_budgets", "created_after"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute(f"SELECT * FROM {table}")
    # What the reader may read in public: exactly the stream views and the granted table.
    readable = strata.query(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace "
        "AND has_table_privilege(%s, c.oid, 'SELECT') ORDER BY 1",
        READER_ROLE,
    )
    assert [name for (name,) in readable] == [
        "campaign_budgets",
        "impsn_count",
        "impsn_top",
        "impsns",
        "later",
        "strata_window_status",
    ]


def test_catalog_functions_run_as_their_owner(strata: Strata) -> None:
    rows = strata.query(
        "SELECT proname, prosecdef, proconfig FROM pg_proc "
        "WHERE proname IN ('strata_serial_until', 'strata_serial_corrected') ORDER BY 1"
    )
    assert rows == [
        ("strata_serial_corrected", True, ["search_path=pg_catalog, pg_temp"]),
        ("strata_serial_until", True, ["search_path=pg_catalog, pg_temp"]),
    ]


def test_reader_password(strata: Strata) -> None:
    engine = strata.service.engine
    configure_reader(engine, "first-pw")
    url = as_role(strata.database_url, READER_ROLE, "first-pw")
    with psycopg.connect(url) as reader:
        assert reader.execute("SELECT 1").fetchone() == (1,)
    if EMBEDDED:  # an external test server's pg_hba.conf may trust everyone
        for wrong in ("second-pw", "", "FIRST-PW", "first-pw2"):
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(as_role(strata.database_url, READER_ROLE, wrong)).close()
                pytest.fail(f"the reader logged in with {wrong!r}")
    # Unset: the role may no longer log in at all.
    configure_reader(engine, None)
    with pytest.raises(psycopg.OperationalError, match="password authentication|not permitted"):
        psycopg.connect(url)
    configure_reader(engine, None)  # already disabled: nothing to do


def test_reader_password_that_cannot_be_set_names_no_secret(pg_url: str) -> None:
    weak = f"strata_weak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'weak-pw'").format(sql.Identifier(weak))
        )
    engine = create_catalog_engine(as_role(pg_url, weak, "weak-pw"))
    try:
        with pytest.raises(ReaderRoleError, match=READER_ROLE) as raised:
            configure_reader(engine, "never-shown-pw")
        assert "never-shown-pw" not in str(raised.value)
    finally:
        engine.dispose()
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(weak)))


def test_migration_downgrades_and_upgrades_again(fresh_db: str) -> None:
    engine = create_catalog_engine(fresh_db)
    try:
        migrate(engine)  # the role exists already (cluster-wide): tolerated
        config = Config(str(MIGRATIONS_DIR / "alembic.ini"))
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0006")
        with psycopg.connect(fresh_db) as conn:  # 0006's broad default is back
            assert conn.execute(
                "SELECT count(*) FROM pg_default_acl WHERE defaclobjtype = 'r' "
                "AND defaclacl::text LIKE %s",
                (f"%{READER_ROLE}%",),
            ).fetchone() == (1,)
        with engine.connect() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, "0005")
        with psycopg.connect(fresh_db) as conn:
            assert conn.execute(
                "SELECT bool_or(prosecdef) FROM pg_proc WHERE proname LIKE 'strata_serial_%'"
            ).fetchone() == (False,)
            assert conn.execute(
                "SELECT count(*) FROM pg_default_acl WHERE defaclacl::text LIKE %s",
                (f"%{READER_ROLE}%",),
            ).fetchone() == (0,)
        migrate(engine)
        with psycopg.connect(fresh_db) as conn:
            assert conn.execute(
                "SELECT bool_and(prosecdef) FROM pg_proc WHERE proname LIKE 'strata_serial_%'"
            ).fetchone() == (True,)
            # No default lets the reader read new tables; the grant function is the owner's.
            assert conn.execute(
                "SELECT count(*) FROM pg_default_acl WHERE defaclobjtype = 'r' "
                "AND defaclacl::text LIKE %s",
                (f"%{READER_ROLE}%",),
            ).fetchone() == (0,)
            assert conn.execute(
                "SELECT has_function_privilege(%s, 'strata_grant_reader(regclass)', 'EXECUTE')",
                (READER_ROLE,),
            ).fetchone() == (False,)
    finally:
        engine.dispose()


# -- the embedded PostgreSQL's pg_hba.conf ------------------------------------------------


def _strip_strata_rules(pg: EmbeddedPostgres) -> None:
    """Make pg_hba.conf what initdb wrote, as in a data dir from before these rules."""
    path = pg.pgdata / "pg_hba.conf"
    lines = path.read_text().splitlines(keepends=True)
    start = lines.index("# BEGIN strata: managed by Strata, rewritten at every start\n")
    end = lines.index("# END strata\n")
    path.write_text("".join(lines[:start] + lines[end + 1 :]).replace("scram-sha-256", "trust"))


def test_embedded_postgres_wants_every_role_s_password(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg")
    url = pg.start()
    try:
        engine = create_catalog_engine(url)
        try:
            migrate(engine)
            configure_reader(engine, "right-pw")
        finally:
            engine.dispose()

        def gets_in(role: str, password: str) -> bool:
            try:
                psycopg.connect(as_role(url, role, password)).close()
            except psycopg.OperationalError as exc:
                assert "password authentication failed" in str(exc)
                return False
            return True

        assert gets_in(READER_ROLE, "right-pw") and not gets_in(READER_ROLE, "wrong-pw")
        assert not gets_in("postgres", "wrong-pw")
        psycopg.connect(url).close()  # the owner's URL, with its password
        # A data dir whose rules say "trust": ours are put back at the next start...
        pg.stop()
        _strip_strata_rules(pg)
        assert EmbeddedPostgres(tmp_path / "pg").start() == url
        assert not gets_in(READER_ROLE, "wrong-pw") and not gets_in("postgres", "wrong-pw")
        # ... and when attaching to a server already running with those rules.
        _strip_strata_rules(pg)
        with psycopg.connect(url, autocommit=True) as owner:
            owner.execute("SELECT pg_reload_conf()")
        assert gets_in("postgres", "wrong-pw")  # the trust rules
        assert EmbeddedPostgres(tmp_path / "pg").start() == url
        assert not gets_in(READER_ROLE, "wrong-pw") and not gets_in("postgres", "wrong-pw")
        psycopg.connect(url).close()
    finally:
        pg.stop()


# -- secrets never in logs ----------------------------------------------------------------


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    return env | {"STRATA_SPARK_WARMUP": "0"}  # no start-up warm-up: tests/test_warmup.py


@contextmanager
def strata_up(data_dir: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """`strata up` as a subprocess, its output in `log`; yields its URL, stops it (SIGTERM)."""
    port = free_port()
    command = [sys.executable, "-m", "server.cli", "up", "--port", str(port), "--pg-port", "0"]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*command, "--data-dir", str(data_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_env() | env,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield base
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=90) == 0, log.read_text()[-4000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.e2e
def test_strata_up_logs_no_secret(pg_url: str, tmp_path: Path) -> None:
    owner = f"strata_owner_{uuid.uuid4().hex[:8]}"
    owner_pw = f"owner-{uuid.uuid4().hex}"
    reader_pw = f"reader-{uuid.uuid4().hex}"
    tokens = {k: f"{k}-{uuid.uuid4().hex}" for k in TOKENS}
    read_file = tmp_path / "read-token"
    read_file.write_text(tokens["read"])
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                sql.Identifier(owner), sql.Literal(owner_pw)
            )
        )
    try:
        with new_database(pg_url) as plain_url:
            database_url = as_role(plain_url, owner, owner_pw)
            env = {
                "STRATA_DATABASE_URL": database_url,
                "STRATA_API_TOKEN": tokens["api"],
                "STRATA_INGEST_TOKEN": tokens["ingest"],
                "STRATA_READ_TOKEN_FILE": str(read_file),
                "STRATA_READER_PASSWORD": reader_pw,
            }
            data_dir = tmp_path / "data"
            log_path = tmp_path / "strata.log"
            with strata_up(data_dir, env, log_path) as base:
                client = httpx.Client(base_url=base, timeout=120)
                assert client.get("/streams").status_code == 401
                assert client.get("/streams", headers=bearer(owner_pw)).status_code == 401
                auth = bearer(tokens["api"])
                assert client.post("/streams", json={"sql": IMPSNS}, headers=auth).is_success
                response = client.post(
                    "/streams/impsns/runs?wait=true",
                    content=ROWS,
                    headers=NDJSON | bearer(tokens["ingest"]),
                )
                assert response.status_code == 200
                assert client.get("/streams", headers=bearer(tokens["read"])).is_success
                # GET /info keeps the URL psql accepts (contract), password included.
                info = client.get("/info", headers=auth).json()
                assert info["database_url"] == database_url
                # `strata backfill-status` uses the token of the environment.
                status = subprocess.run(
                    [sys.executable, "-m", "server.cli", "backfill-status"]
                    + ["--data-dir", str(data_dir)],
                    env=clean_env() | env,
                    capture_output=True,
                    text=True,
                    check=False,
                )
                assert status.returncode == 0, status.stderr
                # The reader's password was applied at start.
                reader_url = as_role(plain_url, READER_ROLE, reader_pw)
                with psycopg.connect(reader_url) as reader:
                    assert reader.execute("SELECT count(*) FROM impsns").fetchone() == (3,)
            log = log_path.read_text()
            assert "Uvicorn running" in log and "401" in log  # it is the server's log
            start_line = next(line for line in log.splitlines() if "database_url" in line)
            assert json.loads(start_line)["database_url"] == as_role(plain_url, owner, "***")
            for name, value in [("owner password", owner_pw), ("reader password", reader_pw)]:
                assert value not in log, name
            for kind, token in tokens.items():
                assert token not in log, kind
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(owner)))
