"""What a BI tool's schema browser shows the dashboard role: every stream view commented
with its SQL and its columns with what they are (additive or not), and no internal table."""

from __future__ import annotations

import psycopg

from server.comments import comment_all
from server.security import READER_ROLE, configure_reader
from tests.conftest import Strata
from tests.test_auth import as_role

RAW = (
    "CREATE STREAM clicks (campaign text, user_id bigint, price double precision, "
    "t timestamptz) WITH (event_time = 't')"
)
PER_HOUR = (
    "CREATE STREAM per_hour AS SELECT campaign, count(*) AS n, sum(price) AS revenue, "
    "avg(price) AS mean, approx_count_distinct(user_id) AS users, window_end AS t "
    "FROM TUMBLE(clicks, t, INTERVAL '1 hour') GROUP BY campaign, window_end"
)


def _comments(connection: psycopg.Connection, view: str) -> tuple[str, dict[str, str]]:
    described = connection.execute(
        "SELECT obj_description(%s::regclass, 'pg_class')", (view,)
    ).fetchone()
    columns = connection.execute(
        "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0",
        (view,),
    ).fetchall()
    assert described is not None
    return described[0], dict(columns)


def test_views_and_columns_are_commented_for_the_reader(strata: Strata) -> None:
    strata.create(RAW)
    strata.create(PER_HOUR)
    configure_reader(strata.service.engine, "comments-pw")
    with psycopg.connect(
        as_role(strata.database_url, READER_ROLE, "comments-pw"), autocommit=True
    ) as reader:
        view, columns = _comments(reader, "public.per_hour")
        assert view == PER_HOUR
        assert columns["campaign"] == "group key"
        assert columns["t"].startswith("window end")
        assert "additive, may be summed" in columns["n"]
        assert "additive, may be summed" in columns["revenue"]
        assert "non-additive" in columns["mean"]
        assert "approximate" in columns["users"] and "non-additive" in columns["users"]
        assert _comments(reader, "public.clicks")[0] == RAW
        # The internal schemas are closed to the reader, and a schema browser that asks
        # information_schema lists none of their tables.
        for schema in ("strata_internal", "strata_catalog"):
            usage = reader.execute("SELECT has_schema_privilege(%s, 'USAGE')", (schema,)).fetchone()
            assert usage == (False,)
        listed = reader.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema <> 'pg_catalog' AND table_schema <> 'information_schema'"
        ).fetchall()
        assert sorted(listed) == [
            ("public", "clicks"),
            ("public", "per_hour"),
            ("public", "strata_window_status"),
        ]


def test_comments_are_written_again_at_start(strata: Strata) -> None:
    strata.create(RAW)
    strata.create(PER_HOUR)
    with psycopg.connect(strata.database_url, autocommit=True) as owner:
        owner.execute("COMMENT ON VIEW public.per_hour IS NULL")
        comment_all(strata.service.engine)
        assert _comments(owner, "public.per_hour")[0] == PER_HOUR
