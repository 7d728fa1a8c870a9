"""The user's SQL functions a stream may call: what the rewriter knows of each (pg_proc's
description of it), and which names of a statement may be such functions.

The server reads these from PostgreSQL's catalog when a stream is created and keeps them
with the stream (as it keeps the tables it joins, rewriter.tables): a function's body is
taken then, like a macro's, so the stream plans the same way at every start whatever
CREATE OR REPLACE FUNCTION did since. rewriter.inline_functions inlines the calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from rewriter.functions import NAMED
from rewriter.parse_stream import derived_select


@dataclass(frozen=True)
class SqlFunction:
    """A function a user created in PostgreSQL, as pg_proc describes it."""

    name: str  # as calls spell it, folded to lower case
    arguments: tuple[tuple[str, str], ...]  # (name, or "" when unnamed; format_type)
    result: str  # format_type of the result
    language: str  # pg_language.lanname: "sql", "plpgsql", ...
    volatility: str  # "immutable", "stable" or "volatile"
    returns_set: bool
    # The body: pg_get_function_sqlbody's "RETURN ..." / "BEGIN ATOMIC ... END" for a
    # SQL-standard body, else prosrc (the text of AS '...').
    body: str

    def to_json(self) -> dict[str, object]:
        return {
            "function": self.name,
            "arguments": [list(a) for a in self.arguments],
            "result": self.result,
            "language": self.language,
            "volatility": self.volatility,
            "returns_set": self.returns_set,
            "body": self.body,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> SqlFunction:
        arguments = data["arguments"]
        assert isinstance(arguments, list)
        return cls(
            name=str(data["function"]),
            arguments=tuple((str(n), str(t)) for n, t in arguments),
            result=str(data["result"]),
            language=str(data["language"]),
            volatility=str(data["volatility"]),
            returns_set=bool(data["returns_set"]),
            body=str(data["body"]),
        )


def is_function_json(data: dict[str, object]) -> bool:
    """Whether an entry of a stream's kept catalog objects is a function (else a table)."""
    return "function" in data


def user_calls(tree: exp.Expr) -> list[str]:
    """The names of the calls in ``tree`` that may be user functions: those sqlglot does
    not know (a built-in it knows is PostgreSQL's, which wins over a user's function of
    the same name), but FROM's (TUMBLE(...) and the like are Strata's)."""
    found: dict[str, None] = {}
    for call in tree.find_all(exp.Anonymous):
        name = call.name.lower()
        if name in NAMED or isinstance(call.parent, exp.Table):
            continue
        found[name] = None
    return list(found)


def referenced_functions(sql: str) -> list[str]:
    """The names of the calls a CREATE STREAM statement makes that may be user functions:
    the candidates the server looks up in pg_proc."""
    select = derived_select(sql)
    return user_calls(select) if select is not None else []
