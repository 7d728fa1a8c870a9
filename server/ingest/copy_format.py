"""The data of ``COPY stream FROM STDIN`` (text or CSV format) read into a run's table.

The formats are PostgreSQL's (its documentation of COPY, "File Formats"):

* text: one row a line, fields split by the delimiter (a tab), NULL written ``\\N``, and
  backslash escapes (``\\t``, ``\\n``, ``\\\\``, octal ``\\123``, hex ``\\x41``; a
  backslash before any other character stands for that character). A line ``\\.`` ends
  the data.
* CSV: fields split by the delimiter (a comma), quoted with the quote character when they
  hold a delimiter, quote or line break (a quote inside doubled, or preceded by the ESCAPE
  character); NULL is an unquoted empty field (or the NULL option's text, unquoted); a
  quoted empty field is the empty string.

``HEADER`` skips the first line, ``HEADER MATCH`` checks that it names the columns in order.
The columns are the COPY's column list, else every column of the stream in declared order;
the others are NULL. Every row must have a field for each of them ("missing data for
column", "extra data after last expected column", as PostgreSQL says).

The values follow the rules of an HTTP run (server/ingest/parse.py): the same field text
gives the same value, or the same error. Errors name the line as counted in the COPY data
(from 1, a header line included; a CSV row spanning lines by the line where it starts),
the column and the value. A fast path hands the whole body to pyarrow's CSV reader; when it
cannot vouch for the result, the rows are walked in Python to find the first problem.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from rewriter.errors import InvalidSQL, UnsupportedSQL
from rewriter.types import ColumnSpec
from server.errors import RunFormatError
from server.ingest.parse import arrow_schema, columns_from_fields, rows_from_fields

_TEXT_ESCAPES = {
    ord("b"): b"\b",
    ord("f"): b"\f",
    ord("n"): b"\n",
    ord("r"): b"\r",
    ord("t"): b"\t",
    ord("v"): b"\v",
}
_OCTAL = re.compile(rb"[0-7]{1,3}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,2}")
_END_OF_DATA = re.compile(rb"(?m)^\\\.\r?$")
_BOOLEAN = {
    "true": True,
    "on": True,
    "1": True,
    "yes": True,
    "false": False,
    "off": False,
    "0": False,
    "no": False,
}
# PostgreSQL refuses these as the text format's delimiter: they begin escapes or numbers.
_TEXT_DELIMITER_FORBIDDEN = "\\.abcdefghijklmnopqrstuvwxyz0123456789"


@dataclass(frozen=True)
class CopyFormat:
    """How the COPY data is written. ``header``: False, True (skip the first line) or
    "match" (the first line must name the columns in order)."""

    csv: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    header: bool | str = False
    quote: str = '"'
    escape: str = '"'

    @classmethod
    def of(
        cls,
        *,
        format: str | None = None,  # noqa: A002 - COPY's own option name
        delimiter: str | None = None,
        null: str | None = None,
        header: str | bool | None = None,
        quote: str | None = None,
        escape: str | None = None,
    ) -> CopyFormat:
        """The format COPY's options describe, checked as PostgreSQL checks them (raises
        InvalidSQL or UnsupportedSQL naming the option)."""
        kind = (format or "text").lower()
        if kind == "binary":
            raise UnsupportedSQL("COPY FORMAT binary is not supported for streams; use text or csv")
        if kind not in ("text", "csv"):
            raise InvalidSQL(f"COPY format {format!r} not recognized; use text or csv")
        csv = kind == "csv"
        if not csv and (quote is not None or escape is not None):
            raise InvalidSQL("COPY QUOTE and ESCAPE are available only in CSV mode")
        chosen = cls(
            csv=csv,
            delimiter=("," if csv else "\t") if delimiter is None else delimiter,
            null=("" if csv else "\\N") if null is None else null,
            header=_header(header),
            quote='"' if quote is None else quote,
            escape=(quote or '"') if escape is None else escape,
        )
        chosen._check()
        return chosen

    def _check(self) -> None:
        if len(self.delimiter.encode()) != 1:
            raise InvalidSQL("COPY delimiter must be a single one-byte character")
        if self.delimiter in "\r\n":
            raise InvalidSQL("COPY delimiter cannot be newline or carriage return")
        if "\r" in self.null or "\n" in self.null:
            raise InvalidSQL("COPY null representation cannot use newline or carriage return")
        if not self.csv and self.delimiter.lower() in _TEXT_DELIMITER_FORBIDDEN:
            raise InvalidSQL(f"COPY delimiter cannot be {self.delimiter!r}")
        if self.csv:
            if len(self.quote.encode()) != 1:
                raise InvalidSQL("COPY quote must be a single one-byte character")
            if len(self.escape.encode()) != 1:
                raise InvalidSQL("COPY escape must be a single one-byte character")
            if self.quote == self.delimiter:
                raise InvalidSQL("COPY delimiter and quote must be different")
        if self.delimiter in self.null:
            raise InvalidSQL("COPY delimiter character must not appear in the NULL specification")


def _header(value: str | bool | None) -> bool | str:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    lowered = value.lower()
    if lowered == "match":
        return "match"
    if lowered in _BOOLEAN:
        return _BOOLEAN[lowered]
    raise InvalidSQL(f'HEADER requires a Boolean value or "match", not {value!r}')


def parse_copy(
    data: bytes,
    copy_format: CopyFormat,
    names: Sequence[str],
    columns: Sequence[ColumnSpec],
    event_time: str,
) -> pa.Table:
    """The run's table of the COPY data ``data``, whose fields are the columns ``names`` (a
    subset of ``columns`` that holds ``event_time``), or RunFormatError."""
    if not copy_format.csv:
        marker = _END_OF_DATA.search(data)
        if marker is not None:
            data = data[: marker.start()]
    if not data:
        return arrow_schema(columns).empty_table()
    fast = _fast(data, copy_format, names, columns, event_time)
    if fast is not None:
        return fast
    records = (
        _text_records(data, copy_format) if not copy_format.csv else _csv_records(data, copy_format)
    )
    rows = _checked(records, copy_format, names)
    return rows_from_fields(rows, names, columns, event_time)


def _fast(
    data: bytes,
    copy_format: CopyFormat,
    names: Sequence[str],
    columns: Sequence[ColumnSpec],
    event_time: str,
) -> pa.Table | None:
    """pyarrow reads the whole of ``data``, if it reads it as PostgreSQL would: CSV as is,
    text without backslash escapes (a backslash in any field sends it to the slow path)."""
    if copy_format.header == "match":
        return None
    quoted = copy_format.csv and copy_format.quote.encode() in data
    try:
        table = pa_csv.read_csv(
            io.BytesIO(data),
            read_options=pa_csv.ReadOptions(
                column_names=list(names), skip_rows=1 if copy_format.header else 0
            ),
            parse_options=pa_csv.ParseOptions(
                delimiter=copy_format.delimiter,
                quote_char=copy_format.quote if copy_format.csv else False,
                double_quote=copy_format.csv and copy_format.escape == copy_format.quote,
                escape_char=(
                    copy_format.escape
                    if copy_format.csv and copy_format.escape != copy_format.quote
                    else False
                ),
                newlines_in_values=quoted,
                ignore_empty_lines=False,
            ),
            convert_options=pa_csv.ConvertOptions(
                column_types={name: pa.string() for name in names},
                null_values=[copy_format.null],
                strings_can_be_null=True,
                quoted_strings_can_be_null=False,
                check_utf8=True,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None
    if table.column_names != list(names):
        return None
    fields = {name: table.column(name) for name in names}
    if not copy_format.csv:
        for column in fields.values():
            if column.null_count < len(column) and pc.any(pc.match_substring(column, "\\")).as_py():
                return None
    return columns_from_fields(fields, columns, event_time)


Record = tuple[int, list[str | None]]


def _checked(
    records: Iterator[Record], copy_format: CopyFormat, names: Sequence[str]
) -> Iterator[Record]:
    """The data's records with the header handled and the field count checked."""
    for line, fields in records:
        if line == 1 and copy_format.header:
            if copy_format.header == "match":
                _match_header(fields, names)
            continue
        if len(fields) < len(names):
            missing = names[len(fields)]
            raise RunFormatError(f"missing data for column {missing!r}", line=line, column=missing)
        if len(fields) > len(names):
            raise RunFormatError(
                f"extra data after last expected column (expected {len(names)} fields, got "
                f"{len(fields)})",
                line=line,
                value=fields[len(names)],
            )
        yield line, fields


def _match_header(fields: list[str | None], names: Sequence[str]) -> None:
    if len(fields) != len(names):
        raise RunFormatError(
            f"wrong number of fields in header line: {len(fields)}, expected {len(names)}", line=1
        )
    for field, name in zip(fields, names, strict=True):
        if field != name:
            raise RunFormatError(
                f"column name mismatch in header line: {field!r} does not match the expected "
                f"column name {name!r}",
                line=1,
                column=name,
                value=field,
            )


def _decoded(raw: bytes, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunFormatError(
            f"the data is not valid UTF-8 (byte 0x{raw[exc.start]:02x})",
            line=line,
            value=raw.decode("utf-8", "backslashreplace"),
        ) from None


# --------------------------------------------------------------------- text format


def _text_records(data: bytes, copy_format: CopyFormat) -> Iterator[Record]:
    delimiter = copy_format.delimiter.encode()
    null = copy_format.null.encode()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        if line.endswith(b"\r"):
            line = line[:-1]
        yield (
            number,
            [
                None if raw == null else _decoded(_unescape(raw), number)
                for raw in _split_text_line(line, delimiter)
            ],
        )


def _split_text_line(line: bytes, delimiter: bytes) -> list[bytes]:
    """The raw fields of a line; a backslash escapes the delimiter (and itself)."""
    if b"\\" not in line:
        return line.split(delimiter)
    fields: list[bytes] = []
    start = 0
    index = 0
    while index < len(line):
        char = line[index : index + 1]
        if char == b"\\":
            index += 2
            continue
        if char == delimiter:
            fields.append(line[start:index])
            start = index + 1
        index += 1
    fields.append(line[start:])
    return fields


def _unescape(raw: bytes) -> bytes:
    if b"\\" not in raw:
        return raw
    out = bytearray()
    index = 0
    while index < len(raw):
        byte = raw[index]
        if byte != 0x5C or index + 1 == len(raw):
            out.append(byte)
            index += 1
            continue
        following = raw[index + 1]
        if following in _TEXT_ESCAPES:
            out += _TEXT_ESCAPES[following]
            index += 2
            continue
        octal = _OCTAL.match(raw, index + 1)
        if octal:
            out.append(int(octal.group(0), 8) & 0xFF)
            index = octal.end()
            continue
        if following == ord("x"):
            hexa = _HEX.match(raw, index + 2)
            if hexa:
                out.append(int(hexa.group(0), 16))
                index = hexa.end()
                continue
        out.append(following)
        index += 2
    return bytes(out)


# ---------------------------------------------------------------------- CSV format


def _csv_records(data: bytes, copy_format: CopyFormat) -> Iterator[Record]:
    """CSV as PostgreSQL reads it: a field is unquoted and quoted stretches (``a"b,c"d`` is
    ``ab,cd``), a quoted stretch may span lines, and inside it the escape character (the
    quote itself by default) before a quote or itself stands for that character. Only a
    field without any quoted stretch can be NULL."""
    text = _decoded_csv(data)
    delimiter, quote, escape = copy_format.delimiter, copy_format.quote, copy_format.escape
    stops = re.compile(f"[{re.escape(delimiter)}{re.escape(quote)}\n]")
    size = len(text)
    position = 0
    line = 1
    while position < size:
        start_line = line
        fields: list[str | None] = []
        while True:  # a field a turn
            parts: list[str] = []
            quoted = False
            while True:  # a stretch a turn
                stop = stops.search(text, position)
                end = stop.start() if stop else size
                parts.append(text[position:end])
                position = end
                if position >= size or text[position] != quote:
                    break
                quoted = True
                position = _quoted_stretch(text, position + 1, quote, escape, parts, start_line)
                line += parts[-1].count("\n")
            raw = "".join(parts)
            if raw.endswith("\r") and (position >= size or text[position] == "\n"):
                raw = raw[:-1]
            fields.append(None if not quoted and raw == copy_format.null else raw)
            if position < size and text[position] == delimiter:
                position += 1
                continue
            if position < size:  # a line break
                position += 1
                line += 1
            break
        yield start_line, fields


def _quoted_stretch(
    text: str, position: int, quote: str, escape: str, parts: list[str], line: int
) -> int:
    """Append the quoted stretch that starts at ``position`` (after its opening quote) to
    ``parts``; return where it ends (after its closing quote)."""
    chunk: list[str] = []
    size = len(text)
    while True:
        if position >= size:
            raise RunFormatError(
                "unterminated CSV quoted field", line=line, value="".join(chunk)[:80]
            )
        char = text[position]
        if char == escape and position + 1 < size and text[position + 1] in (quote, escape):
            chunk.append(text[position + 1])
            position += 2
            continue
        if char == quote:
            parts.append("".join(chunk))
            return position + 1
        chunk.append(char)
        position += 1


def _decoded_csv(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        start = data.rfind(b"\n", 0, exc.start) + 1
        end = data.find(b"\n", exc.start)
        raise RunFormatError(
            f"the data is not valid UTF-8 (byte 0x{data[exc.start]:02x})",
            line=line,
            value=data[start : end if end >= 0 else len(data)].decode("utf-8", "backslashreplace"),
        ) from None
