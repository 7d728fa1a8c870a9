"""Unit tests of rewriter.parse_stream: the seeds' window sugar, and positions in errors.

The sugar of seeds/003 (``FROM impsns <SLICES '1 minute'>``, ``<VISIBLE ... ADVANCE ...>``,
``cq_close(*)``) must give the very tree of the standard form it stands for, with the
time column left out (resolve_window fills in the source's event-time column). Errors
name where the offending construct starts: "line L, column C: ...", both from 1.
"""

from __future__ import annotations

import pytest
from sqlglot import exp

from rewriter import ParallelAggregatePlan, rewrite
from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from rewriter.parse_stream import DerivedStreamStatement, RawStreamStatement, parse_stream
from rewriter.positions import line_and_column, located, position_of
from tests.test_rewriter import sources


def select_of(sql: str) -> exp.Select:
    statement = parse_stream(sql)
    assert isinstance(statement, DerivedStreamStatement)
    return statement.select


def desugared(body: str) -> str:
    return select_of(f"CREATE STREAM s AS {body}").sql("postgres")


# (patent form, the standard form it stands for, printed)
SUGAR = [
    pytest.param(
        "SELECT campaign, count(*) AS c, cq_close(*) AS t FROM impsns <SLICES '1 minute'> "
        "GROUP BY campaign",
        "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "SELECT campaign, COUNT(*) AS c, window_end AS t FROM TUMBLE(impsns, INTERVAL "
        "'1 MINUTE') GROUP BY campaign, window_end",
        id="slices",
    ),
    pytest.param(
        "select campaign, count(*) as c, CQ_CLOSE() as t from impsns <slices '1 minute'> "
        "group by campaign",
        "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "SELECT campaign, COUNT(*) AS c, window_end AS t FROM TUMBLE(impsns, INTERVAL "
        "'1 MINUTE') GROUP BY campaign, window_end",
        id="lower-case-and-no-star",
    ),
    pytest.param(
        "SELECT campaign, count(*) AS c, cq_close(*) AS t "
        "FROM impsns <VISIBLE '5 minutes' ADVANCE '1 minute'> GROUP BY campaign",
        "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM HOP(impsns, INTERVAL '1 minute', INTERVAL '5 minutes') GROUP BY campaign, window_end",
        "SELECT campaign, COUNT(*) AS c, window_end AS t FROM HOP(impsns, INTERVAL '1 MINUTE', "
        "INTERVAL '5 MINUTES') GROUP BY campaign, window_end",
        id="visible-advance-is-hop-slide-then-size",
    ),
    pytest.param(
        "SELECT count(*), cq_close(*) FROM impsns <SLICES '1 minute'>",
        "SELECT count(*), window_end AS cq_close FROM TUMBLE(impsns, INTERVAL '1 minute') "
        "GROUP BY window_end",
        "SELECT COUNT(*), window_end AS cq_close FROM TUMBLE(impsns, INTERVAL '1 MINUTE') "
        "GROUP BY window_end",
        id="unaliased-keeps-postgres-name-and-no-group-by",
    ),
    pytest.param(
        "SELECT campaign, count(*) AS c, cq_close(*) AS t FROM impsns <SLICES '1 minute'> "
        "GROUP BY campaign, cq_close(*)",
        "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "SELECT campaign, COUNT(*) AS c, window_end AS t FROM TUMBLE(impsns, INTERVAL "
        "'1 MINUTE') GROUP BY campaign, window_end",
        id="cq-close-in-group-by",
    ),
    pytest.param(
        "SELECT campaign, count(*) AS c, cq_close(*) AS t FROM impsns <SLICES '1 minute'> "
        "GROUP BY 1, 3",
        "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, INTERVAL '1 minute') GROUP BY 1, 3",
        "SELECT campaign, COUNT(*) AS c, window_end AS t FROM TUMBLE(impsns, INTERVAL "
        "'1 MINUTE') GROUP BY 1, 3",
        id="window-by-position-is-not-added-twice",
    ),
    pytest.param(
        "SELECT campaign, count(*) AS c, window_start FROM impsns <SLICES '1 minute'> "
        "GROUP BY campaign, window_start",
        "SELECT campaign, count(*) AS c, window_start "
        "FROM TUMBLE(impsns, INTERVAL '1 minute') GROUP BY campaign, window_start",
        "SELECT campaign, COUNT(*) AS c, window_start FROM TUMBLE(impsns, INTERVAL "
        "'1 MINUTE') GROUP BY campaign, window_start",
        id="window-start-already-grouped",
    ),
    pytest.param(
        "SELECT campaign, count(*) AS c FROM impsns <SLICES '1 minute'> GROUP BY campaign",
        "SELECT campaign, count(*) AS c FROM TUMBLE(impsns, INTERVAL '1 minute') "
        "GROUP BY campaign, window_end",
        "SELECT campaign, COUNT(*) AS c FROM TUMBLE(impsns, INTERVAL '1 MINUTE') "
        "GROUP BY campaign, window_end",
        id="a-slice-groups-by-its-window",
    ),
    pytest.param(
        "SELECT campaign, count(*) AS c, cq_close(*) AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign",
        "SELECT campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY campaign, window_end",
        "SELECT campaign, COUNT(*) AS c, window_end AS t FROM TUMBLE(impsns, t, INTERVAL "
        "'1 MINUTE') GROUP BY campaign, window_end",
        id="cq-close-with-the-standard-window",
    ),
    pytest.param(
        "(SELECT i.campaign, count(*) AS c, cq_close(*) AS t\n"
        "   FROM \"impsns\" <Slices '1 hour 30 minutes'> AS i -- a comment\n"
        "  WHERE i.price > 1 GROUP BY i.campaign HAVING count(*) > 2)",
        "SELECT i.campaign, count(*) AS c, window_end AS t "
        "FROM TUMBLE(\"impsns\", INTERVAL '1 hour 30 minutes') AS i "
        "WHERE i.price > 1 GROUP BY i.campaign, window_end HAVING count(*) > 2",
        'SELECT i.campaign, COUNT(*) AS c, window_end AS t FROM TUMBLE("impsns", INTERVAL '
        "'1 hour 30 minutes') AS i /* a comment */ WHERE i.price > 1 GROUP BY i.campaign, "
        "window_end "
        "HAVING COUNT(*) > 2",
        id="parenthesized-quoted-alias-multi-line",
    ),
]


@pytest.mark.parametrize("sugar,standard,printed", SUGAR)
def test_sugar_is_the_standard_form(sugar: str, standard: str, printed: str) -> None:
    tree = select_of(f"CREATE STREAM s AS {sugar}")
    assert tree.sql("postgres") == printed
    assert tree == select_of(f"CREATE STREAM s AS {standard}")


def test_the_patents_impsn_count() -> None:
    statement = parse_stream(
        "create stream impsn_count as\n"
        "  (select campaign, count(*) as c, cq_close(*) as t\n"
        "     from impsns <slices '1 minute'>\n"
        "    group by campaign)"
    )
    assert isinstance(statement, DerivedStreamStatement)
    assert statement.name == "impsn_count"
    call = statement.select.args["from_"].this.this
    assert isinstance(call, exp.Anonymous) and call.name == "TUMBLE"
    # Two arguments: the source and the size; no time column (the source's event time).
    source, size = call.expressions
    assert isinstance(source, exp.Column) and source.name == "impsns"
    assert isinstance(size, exp.Interval) and size.sql("postgres") == "INTERVAL '1 MINUTE'"


def test_sugar_plans_like_the_standard_form() -> None:
    """Through the whole rewrite, with impsns's event-time column t filled in."""
    pairs = [
        ("<SLICES '1 minute'>", "TUMBLE(impsns, t, INTERVAL '1 minute')"),
        (
            "<VISIBLE '5 minutes' ADVANCE '1 minute'>",
            "HOP(impsns, t, INTERVAL '1 minute', INTERVAL '5 minutes')",
        ),
    ]
    for clause, window in pairs:
        sugar = rewrite(
            "CREATE STREAM d AS SELECT campaign, sum(price) AS s, cq_close(*) AS t "
            f"FROM impsns {clause} GROUP BY campaign",
            sources(),
        )
        standard = rewrite(
            "CREATE STREAM d AS SELECT campaign, sum(price) AS s, window_end AS t "
            f"FROM {window} GROUP BY campaign, window_end",
            sources(),
        )
        assert isinstance(sugar, ParallelAggregatePlan)
        assert isinstance(standard, ParallelAggregatePlan)
        assert sugar.view_query == standard.view_query
        assert sugar.partial_query == standard.partial_query


def test_sugar_leaves_other_comparisons_alone() -> None:
    assert desugared(
        "SELECT count(*) AS c FROM TUMBLE(impsns, t, INTERVAL '1 minute') "
        "WHERE price < 2 GROUP BY window_end HAVING count(*) > 1"
    ) == (
        "SELECT COUNT(*) AS c FROM TUMBLE(impsns, t, INTERVAL '1 MINUTE') "
        "WHERE price < 2 GROUP BY window_end HAVING COUNT(*) > 1"
    )


def test_a_column_named_slices_is_still_a_column() -> None:
    assert desugared(
        "SELECT count(*) AS c FROM TUMBLE(impsns, t, INTERVAL '1 minute') "
        "WHERE price <slices AND price > visible GROUP BY window_end"
    ) == (
        "SELECT COUNT(*) AS c FROM TUMBLE(impsns, t, INTERVAL '1 MINUTE') "
        "WHERE price < slices AND price > visible GROUP BY window_end"
    )


def test_raw_streams_are_unchanged() -> None:
    statement = parse_stream(
        "CREATE STREAM impsns (campaign text, t timestamptz) WITH (event_time = 't')"
    )
    assert isinstance(statement, RawStreamStatement)
    assert [c.name for c in statement.columns] == ["campaign", "t"]


def test_positions_are_those_of_the_users_text() -> None:
    sql = (
        "CREATE STREAM s AS\n"
        "  SELECT campaign, count(*) AS c, cq_close(*) AS t\n"
        "  FROM impsns <VISIBLE '5 minutes' ADVANCE '1 minute'> WHERE price > 1\n"
        "  GROUP BY campaign ORDER BY c"
    )
    select = select_of(sql)
    lines = sql.split("\n")

    def at(line: int, text: str, occurrence: int = 0) -> tuple[int, int]:
        column = -1
        for _ in range(occurrence + 1):
            column = lines[line - 1].index(text, column + 1)
        return (line, column + 1)

    assert position_of(select) == at(2, "SELECT")
    assert position_of(select.expressions[0]) == at(2, "campaign")
    assert position_of(select.expressions[1]) == at(2, "count")
    # cq_close(*) became window_end but still points where the user wrote it.
    assert position_of(select.expressions[2]) == at(2, "cq_close")
    table = select.args["from_"].this
    call = table.this
    assert position_of(call) == at(3, "<VISIBLE")
    assert position_of(call.expressions[0]) == at(3, "impsns")
    assert position_of(call.expressions[1]) == at(3, "'1 minute'")
    assert position_of(call.expressions[2]) == at(3, "'5 minutes'")
    # Offsets after a window clause are unchanged by it.
    assert position_of(select.args["where"]) == at(3, "WHERE")
    assert position_of(select.args["where"].this) == at(3, "price")
    assert position_of(select.args["group"]) == at(4, "GROUP BY")
    assert position_of(select.args["order"]) == at(4, "ORDER BY")
    # A copy keeps them; a node built later has none of its own.
    assert position_of(select.copy().expressions[1]) == at(2, "count")
    assert position_of(exp.column("x")) is None
    added = select.args["group"].expressions[-1]
    assert added.name == "window_end" and position_of(added) is None


def test_line_and_column_count_from_one() -> None:
    assert line_and_column("ab\ncd", 0) == (1, 1)
    assert line_and_column("ab\ncd", 4) == (2, 2)


ERRORS = [
    ("SELECT 1", InvalidSQL, "expected a CREATE STREAM statement", (1, 1)),
    ("CREATE TABLE t AS SELECT 1", InvalidSQL, "expected a CREATE STREAM statement", (1, 8)),
    (
        "CREATE STREAM a (x int, t timestamptz) WITH (event_time = 't');\nDROP TABLE a",
        InvalidSQL,
        "only one statement per request",
        (1, 63),
    ),
    ("CREATE STREAM s AS\nSELECT FROM WHERE", InvalidSQL, "syntax error at 'WHERE'", (2, 13)),
    ("CREATE STREAM s AS SELECT 'abc FROM x", InvalidSQL, "missing the closing '", (1, 27)),
    ("CREATE STREAM IF NOT EXISTS a AS SELECT 1", UnsupportedSQL, "IF NOT EXISTS", (1, 15)),
    (
        "CREATE STREAM \"A-b\" (x int, t timestamptz) WITH (event_time = 't')",
        InvalidSQL,
        "invalid stream name 'A-b'",
        (1, 15),
    ),
    (
        "CREATE STREAM a (x int, t timestamptz)\n  WITH (event_time = 'ts')",
        InvalidSQL,
        "event_time names 'ts'",
        (2, 22),
    ),
    (
        "CREATE STREAM a (x int, t timestamp) WITH (event_time = 't')",
        UnsupportedSQL,
        "must be timestamptz",
        (1, 57),
    ),
    (
        "CREATE STREAM a (x int, t timestamptz) WITH (event_time = 't', colour = 'red')",
        UnsupportedSQL,
        "unknown stream option 'colour'",
        (1, 64),
    ),
    (
        "CREATE STREAM a (x int,\n  x int, t timestamptz) WITH (event_time = 't')",
        InvalidSQL,
        "declared twice",
        (2, 3),
    ),
    (
        "CREATE STREAM a (x int, y jsonb, t timestamptz) WITH (event_time = 't')",
        UnsupportedSQL,
        "supported types:",
        (1, 25),
    ),
    (
        "CREATE STREAM a (x int NOT NULL, t timestamptz) WITH (event_time = 't')",
        UnsupportedSQL,
        "constraints are not supported",
        (1, 18),
    ),
    ("CREATE STREAM d (a int) AS SELECT 1", UnsupportedSQL, "drop the list", (1, 18)),
    (
        "CREATE STREAM d AS SELECT 1 INTERSECT SELECT 2",
        UnsupportedSQL,
        "INTERSECT is not supported: keep the rows of the first query with (or without) a match",
        (1, 29),
    ),
    (
        "CREATE STREAM d AS SELECT count(*) FROM impsns <SLICES 10 ROWS>",
        UnsupportedSQL,
        "row-based windows",
        (1, 56),
    ),
    (
        "CREATE STREAM d AS SELECT count(*) FROM impsns <VISIBLE '5 minutes'>",
        UnsupportedSQL,
        "ADVANCE",
        (1, 68),
    ),
    (
        "CREATE STREAM d AS SELECT count(*) FROM impsns <SLICES $$1 minute$$>",
        UnsupportedSQL,
        "takes a quoted interval",
        (1, 56),
    ),
    (
        "CREATE STREAM d AS SELECT count(*) FROM impsns <SLICES minute>",
        UnsupportedSQL,
        "takes a quoted interval",
        (1, 56),
    ),
    (
        "CREATE STREAM d AS SELECT count(*) FROM impsns <SLICES '1 minute' GROUP BY 1",
        InvalidSQL,
        "not closed by '>'",
        (1, 67),
    ),
    (
        "CREATE STREAM d AS SELECT count(*) FROM impsns AS i <SLICES '1 minute'>",
        UnsupportedSQL,
        "follows the stream name right after FROM",
        (1, 53),
    ),
    (
        "CREATE STREAM d AS SELECT count(*), cq_close(t) FROM impsns <SLICES '1 minute'>",
        UnsupportedSQL,
        "cq_close(*) takes no argument",
        (1, 37),
    ),
]


@pytest.mark.parametrize("sql,kind,fragment,position", ERRORS)
def test_errors_say_what_and_where(
    sql: str, kind: type[StrataError], fragment: str, position: tuple[int, int]
) -> None:
    with pytest.raises(kind) as caught:
        parse_stream(sql)
    assert caught.value.position == position
    assert str(caught.value).startswith(f"line {position[0]}, column {position[1]}: ")
    assert fragment in str(caught.value)


def test_errors_without_a_position_read_as_before() -> None:
    error = UnsupportedSQL("joins are not supported")
    assert (str(error), error.position, error.message) == (
        "joins are not supported",
        None,
        "joins are not supported",
    )
    assert str(error.locate((2, 5))) == "line 2, column 5: joins are not supported"
    # The first (closest) position wins.
    assert str(error.locate((1, 1))) == "line 2, column 5: joins are not supported"


def test_located_gives_errors_the_position_of_a_node() -> None:
    select = select_of(
        "CREATE STREAM s AS SELECT count(*) AS c\n"
        "  FROM TUMBLE(impsns, t, INTERVAL '1 minute') GROUP BY window_end"
    )
    item = select.expressions[0]
    with pytest.raises(UnsupportedSQL) as caught, located(item):
        raise UnsupportedSQL("count is not welcome")
    assert str(caught.value) == "line 1, column 27: count is not welcome"
    with pytest.raises(UnsupportedSQL) as caught, located(item):
        raise UnsupportedSQL("already placed", position=(2, 3))
    assert caught.value.position == (2, 3)
    with pytest.raises(UnsupportedSQL) as caught, located(exp.column("new")):
        raise UnsupportedSQL("nowhere")
    assert str(caught.value) == "nowhere"
