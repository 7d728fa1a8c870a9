"""The one error hierarchy of Strata; server/api/errors.py maps it onto HTTP codes."""

from __future__ import annotations


class StrataError(Exception):
    """Base of every error Strata reports to a user.

    ``position`` is where the offending construct starts in the user's statement, as
    (line, column) counted from 1 (see rewriter.positions); the message then begins with it.
    """

    position: tuple[int, int] | None = None

    def __init__(self, message: str = "", *, position: tuple[int, int] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if position is not None:
            self.locate(position)

    def locate(self, position: tuple[int, int]) -> StrataError:
        """Name where the error is, unless a closer position is already known."""
        if self.position is None:
            self.position = position
            self.args = (f"line {position[0]}, column {position[1]}: {self.message}",)
        return self


class InvalidSQL(StrataError):
    """The statement is not valid SQL, or not a CREATE STREAM statement."""


class UnsupportedSQL(StrataError):
    """The statement is valid SQL but uses something Strata does not support (yet)."""


class UnknownStream(StrataError):
    """A statement or request names a stream that does not exist."""


class UnknownSource(InvalidSQL, UnknownStream):
    """A CREATE STREAM reads from a stream that does not exist: the statement is invalid
    (HTTP 400, like any other invalid statement), not a missing resource (404)."""


class StreamExists(StrataError):
    """CREATE STREAM names a stream (or another relation) that already exists."""


class StreamInUse(StrataError):
    """DROP of a stream that other streams are derived from."""


class RunFormatError(StrataError):
    """A run's body is malformed. Names the physical line (from 1), the column and the value."""

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        column: str | None = None,
        value: str | None = None,
    ) -> None:
        self.line = line
        self.column = column
        self.value = value
        where = []
        if line is not None:
            where.append(f"line {line}")
        if column is not None:
            where.append(f"column {_shorten(column, 80)!r}")
        prefix = ", ".join(where)
        text = f"{prefix}: {message}" if prefix else message
        if value is not None:
            text += f" (value: {_shorten(value, 80)!r})"
        super().__init__(text)

    def to_dict(self) -> dict[str, object]:
        """The error as an HTTP body. A value or a column name taken from the body is cut
        to MAX_SHOWN characters (a malformed line of megabytes is not echoed back), and a
        lone surrogate in it (a JSON escape such as "\\ud800") is shown escaped, since
        UTF-8 cannot carry it."""
        return {
            "error": str(self),
            "line": self.line,
            "column": None if self.column is None else _echo(self.column),
            "value": None if self.value is None else _echo(self.value),
        }


# Longest value or column name an HTTP error body repeats from a run.
MAX_SHOWN = 1000


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _echo(text: str) -> str:
    return _shorten(text, MAX_SHOWN).encode("utf-8", "backslashreplace").decode("utf-8")
