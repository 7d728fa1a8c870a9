"""CREATE SINK and DROP SINK, read from their text (the HTTP API's and the SQL port's alike),
and the connectors a sink may name, as data: adding one is one entry here plus its target
in server/sinks/worker.py's TARGETS.

    CREATE SINK [IF NOT EXISTS] name FROM stream
      WITH (connector = 'postgres', url = 'postgresql://...', table = '[schema.]table'
            [, batch_size = n])
    CREATE SINK name FROM stream WITH (connector = 'webhook', url = 'http://...'
            [, batch_size = n])
    CREATE SINK name FROM stream WITH (connector = 'kafka', brokers = 'host:port[,...]',
            topic = 'topic' [, batch_size = n])
    DROP SINK [IF EXISTS] name

The shape is RisingWave's (``CREATE SINK ... FROM ... WITH (connector = ...)``); an option
or a connector Strata does not know is refused by name, with the ones it knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from rewriter.errors import InvalidSQL, StrataError, UnsupportedSQL
from server.pgwire.lexer import Token, Unreadable, tokenize


@dataclass(frozen=True)
class Connector:
    """A kind of sink: the options it needs, those it may take, and what each means."""

    name: str
    required: tuple[str, ...]
    optional: tuple[str, ...]
    schemes: tuple[str, ...]  # what its url may start with (none: it takes no url)
    summary: str

    @property
    def options(self) -> tuple[str, ...]:
        return ("connector", *self.required, *self.optional)


CONNECTORS: dict[str, Connector] = {
    "postgres": Connector(
        "postgres",
        required=("url", "table"),
        optional=("batch_size",),
        schemes=("postgresql", "postgres"),
        summary="upserts into a table of another PostgreSQL, with the position kept there "
        "in the same transaction",
    ),
    "webhook": Connector(
        "webhook",
        required=("url",),
        optional=("batch_size",),
        schemes=("http", "https"),
        summary="JSON batches POSTed with their position, retried with backoff",
    ),
    "kafka": Connector(
        "kafka",
        required=("brokers", "topic"),
        optional=("batch_size",),
        schemes=(),
        summary="keyed messages with their positions, by an idempotent producer, and a "
        "progress record in a topic beside them",
    ),
}
# Connectors named in issues but not built yet: refused with what they will be.
PLANNED: dict[str, str] = {}
MAX_BATCH_SIZE = 100_000
# A Kafka topic's name: its legal characters, and room left for the progress topic's suffix
# (server/sinks/kafka.py) within Kafka's 249.
TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
BROKER = re.compile(r"[A-Za-z0-9.\-]+:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5}")


@dataclass(frozen=True)
class CreateSink:
    name: str
    stream: str
    connector: str
    options: dict[str, str]  # every option but connector, by lower-cased name
    if_not_exists: bool = False

    @property
    def batch_size(self) -> int | None:
        given = self.options.get("batch_size")
        return None if given is None else int(given)


@dataclass(frozen=True)
class DropSink:
    name: str
    if_exists: bool = False


def is_sink_statement(text: str) -> bool:
    """Does ``text`` start with CREATE SINK or DROP SINK (comments and case aside)?"""
    try:
        tokens = tokenize(text)
    except Unreadable:
        return False
    return len(tokens) >= 2 and tokens[0].is_word("create", "drop") and tokens[1].is_word("sink")


def parse_sink(text: str) -> CreateSink | DropSink:
    """The sink statement ``text`` holds; InvalidSQL or UnsupportedSQL naming the problem."""
    try:
        tokens = tokenize(text)
    except Unreadable as error:
        raise InvalidSQL(f"the statement cannot be read: {error}") from None
    while tokens and tokens[-1].is_op(";"):
        tokens.pop()
    if len(tokens) < 2 or not tokens[1].is_word("sink"):
        raise InvalidSQL("expected CREATE SINK or DROP SINK")
    reader = _Reader(text, tokens, 2)
    if tokens[0].is_word("drop"):
        if_exists = reader.words("if", "exists")
        name = reader.name("DROP SINK needs a sink name here")
        reader.end("DROP SINK takes one sink name")
        return DropSink(name, if_exists)
    if_not_exists = reader.words("if", "not", "exists")
    name = reader.name("CREATE SINK needs a sink name here")
    if not reader.words("from"):
        raise reader.error(InvalidSQL("CREATE SINK name needs FROM stream here"))
    stream = reader.name("CREATE SINK ... FROM needs a stream name here")
    if not reader.words("with"):
        raise reader.error(
            InvalidSQL(
                "CREATE SINK ... FROM stream needs WITH (connector = ..., ...) here; "
                f"connectors: {', '.join(CONNECTORS)}"
            )
        )
    given = reader.options()
    reader.end("CREATE SINK ends after its WITH (...) options")
    return _checked(name, stream, given, if_not_exists)


def _checked(
    name: str, stream: str, given: dict[str, tuple[str, Token]], if_not_exists: bool
) -> CreateSink:
    if "connector" not in given:
        raise InvalidSQL(
            f"CREATE SINK needs a connector option: connector = one of {', '.join(CONNECTORS)}"
        )
    chosen = given["connector"][0].lower()
    connector = CONNECTORS.get(chosen)
    if connector is None:
        why = PLANNED.get(chosen, f"connector {chosen!r} is not supported")
        raise UnsupportedSQL(f"{why}; supported connectors: {', '.join(CONNECTORS)}")
    unknown = [option for option in given if option not in connector.options]
    if unknown:
        raise UnsupportedSQL(
            f"option {unknown[0]!r} is not an option of the {chosen} connector; it takes "
            f"{', '.join(connector.options)}"
        )
    missing = [option for option in connector.required if option not in given]
    if missing:
        raise InvalidSQL(f"the {chosen} connector needs the option {missing[0]!r}")
    options = {option: value for option, (value, _) in given.items() if option != "connector"}
    if "url" in options:
        scheme = urlsplit(options["url"]).scheme.lower()
        if scheme not in connector.schemes or not urlsplit(options["url"]).hostname:
            raise InvalidSQL(
                f"the {chosen} connector's url must be a {' or '.join(connector.schemes)}:// "
                "URL with a host"
            )
    if "brokers" in options and not all(
        BROKER.fullmatch(b.strip()) for b in options["brokers"].split(",")
    ):
        raise InvalidSQL("brokers must list the Kafka brokers as 'host:port[,host:port...]'")
    if "topic" in options and (
        not TOPIC_NAME.fullmatch(options["topic"]) or options["topic"] in (".", "..")
    ):
        raise InvalidSQL(
            "topic must be a Kafka topic name: up to 200 letters, digits, '.', '_' or '-'"
        )
    if "table" in options:
        parts = options["table"].split(".")
        if len(parts) > 2 or not all(parts):
            raise InvalidSQL("table must name a table as 'table' or 'schema.table'")
    batch = options.get("batch_size")
    if batch is not None and not (batch.isdigit() and 1 <= int(batch) <= MAX_BATCH_SIZE):
        raise InvalidSQL(f"batch_size must be a whole number from 1 to {MAX_BATCH_SIZE}")
    return CreateSink(name, stream, chosen, options, if_not_exists)


class _Reader:
    """Tokens of a sink statement, read from left to right."""

    def __init__(self, text: str, tokens: list[Token], index: int) -> None:
        self.text, self.tokens, self.index = text, tokens, index

    def error(self, error: StrataError) -> StrataError:
        at = self.tokens[self.index].start if self.index < len(self.tokens) else len(self.text)
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        return error.locate((line, column))

    def words(self, *words: str) -> bool:
        """Take ``words`` if they come next, all of them."""
        ahead = self.tokens[self.index : self.index + len(words)]
        if len(ahead) == len(words) and all(
            t.is_word(w) for t, w in zip(ahead, words, strict=True)
        ):
            self.index += len(words)
            return True
        return False

    def name(self, message: str) -> str:
        if self.index >= len(self.tokens) or self.tokens[self.index].kind not in ("word", "ident"):
            raise self.error(InvalidSQL(message))
        token = self.tokens[self.index]
        self.index += 1
        if self.index < len(self.tokens) and self.tokens[self.index].is_op("."):
            if token.value != "public":
                raise self.error(InvalidSQL("streams and sinks live in the public schema"))
            self.index += 1
            return self.name(message)
        return token.value

    def options(self) -> dict[str, tuple[str, Token]]:
        """``(name = value, ...)``: values are string constants, numbers or words."""
        if self.index >= len(self.tokens) or not self.tokens[self.index].is_op("("):
            raise self.error(InvalidSQL("WITH needs a parenthesised list of options"))
        self.index += 1
        found: dict[str, tuple[str, Token]] = {}
        while True:
            if self.index >= len(self.tokens) or self.tokens[self.index].kind not in (
                "word",
                "ident",
            ):
                raise self.error(InvalidSQL("an option name was expected here"))
            option = self.tokens[self.index]
            name = option.value.lower()
            self.index += 1
            if self.index < len(self.tokens) and self.tokens[self.index].is_op("="):
                self.index += 1
            if self.index >= len(self.tokens) or self.tokens[self.index].kind not in (
                "string",
                "number",
                "word",
            ):
                raise self.error(InvalidSQL(f"option {name!r} needs a value: {name} = '...'"))
            value = self.tokens[self.index].value
            if name in found:
                raise self.error(InvalidSQL(f"option {name!r} is given twice"))
            found[name] = (value, option)
            self.index += 1
            if self.index < len(self.tokens) and self.tokens[self.index].is_op(","):
                self.index += 1
                continue
            if self.index < len(self.tokens) and self.tokens[self.index].is_op(")"):
                self.index += 1
                return found
            raise self.error(InvalidSQL("the options are not closed with ')'"))

    def end(self, message: str) -> None:
        if self.index < len(self.tokens):
            raise self.error(InvalidSQL(f"{message}; unexpected {self.tokens[self.index].value!r}"))
