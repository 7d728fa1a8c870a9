"""The rewriter's errors, and the base of every error Strata reports to a user
(server/errors.py holds the service's; server/api/errors.py maps both onto HTTP codes)."""

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


class UnknownSource(InvalidSQL):
    """A CREATE STREAM reads from a stream that does not exist: the statement is invalid
    (HTTP 400, like any other invalid statement), not a missing resource (404)."""
