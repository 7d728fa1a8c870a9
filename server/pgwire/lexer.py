"""PostgreSQL's lexical rules, as far as the SQL port needs them: the tokens of a query
string (words folded to lower case, quoted identifiers, string constants in all their forms
decoded, dollar quoting, numbers, parameters, nested comments skipped) and its split into
statements at the semicolons outside quotes and comments."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SPACE = " \t\n\r\f\v"
_IDENT_START = re.compile(r"[A-Za-z_\u0080-\U0010ffff]")
_IDENT = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]*")
_NUMBER = re.compile(r"(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)(?:[eE][+-]?[0-9]+)?")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
_PARAM = re.compile(r"\$([0-9]+)")
_OCTAL = re.compile(r"[0-7]{1,3}")
_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class Unreadable(Exception):  # noqa: N818 - not an error of Strata's: PostgreSQL answers
    """The lexer cannot read the string (an unterminated quote or comment)."""


@dataclass(frozen=True, slots=True)
class Token:
    """``kind``: word (unquoted, lower-cased), ident (quoted identifier), string, number,
    param ($n), op (one character, or ``::``). ``start``/``end``: offsets in the string."""

    kind: str
    value: str
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.value in words

    def is_op(self, op: str) -> bool:
        return self.kind == "op" and self.value == op


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    position = 0
    size = len(text)
    while position < size:
        char = text[position]
        if char in _SPACE:
            position += 1
        elif text.startswith("--", position):
            end = text.find("\n", position)
            position = size if end < 0 else end + 1
        elif text.startswith("/*", position):
            position = _skip_comment(text, position)
        elif char in "'\"" or (
            char in "eEnNbBxXuU" and _quoted_after_prefix(text, position) is not None
        ):
            token = _quoted(text, position)
            tokens.append(token)
            position = token.end
        elif char == "$":
            param = _PARAM.match(text, position)
            if param:
                tokens.append(Token("param", param.group(1), position, param.end()))
                position = param.end()
                continue
            tag = _DOLLAR_TAG.match(text, position)
            if tag is None:
                tokens.append(Token("op", "$", position, position + 1))
                position += 1
                continue
            close = text.find(tag.group(0), tag.end())
            if close < 0:
                raise Unreadable("unterminated dollar-quoted string")
            end = close + len(tag.group(0))
            tokens.append(Token("string", text[tag.end() : close], position, end))
            position = end
        elif char.isdigit() or (
            char == "." and position + 1 < size and text[position + 1].isdigit()
        ):
            number = _NUMBER.match(text, position)
            assert number is not None
            tokens.append(Token("number", number.group(0).replace("_", ""), position, number.end()))
            position = number.end()
        elif _IDENT_START.match(char):
            word = _IDENT.match(text, position + 1)
            assert word is not None
            end = word.end()
            tokens.append(Token("word", _fold(text[position:end]), position, end))
            position = end
        elif text.startswith("::", position):
            tokens.append(Token("op", "::", position, position + 2))
            position += 2
        else:
            tokens.append(Token("op", char, position, position + 1))
            position += 1
    return tokens


def _fold(word: str) -> str:
    """PostgreSQL folds unquoted identifiers to lower case (ASCII letters)."""
    return word.translate(_UPPER_TO_LOWER)


_UPPER_TO_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _skip_comment(text: str, position: int) -> int:
    depth = 0
    while position < len(text):
        if text.startswith("/*", position):
            depth += 1
            position += 2
        elif text.startswith("*/", position):
            depth -= 1
            position += 2
            if depth == 0:
                return position
        else:
            position += 1
    raise Unreadable("unterminated comment")


def _quoted_after_prefix(text: str, position: int) -> str | None:
    """The prefix of a prefixed string constant at ``position`` (E'', N'', B'', X'', U&'')."""
    char = text[position].lower()
    if char == "u":
        if text.startswith("&'", position + 1) or text.startswith('&"', position + 1):
            return "u&"
        return None
    if text.startswith("'", position + 1):
        return char
    return None


def _quoted(text: str, position: int) -> Token:
    prefix = _quoted_after_prefix(text, position) or ""
    quote_at = position + len(prefix)
    quote = text[quote_at]
    escapes = prefix == "e"
    chars: list[str] = []
    index = quote_at + 1
    while True:
        if index >= len(text):
            raise Unreadable("unterminated quoted string or identifier")
        char = text[index]
        if char == quote:
            if text.startswith(quote, index + 1):  # a doubled quote stands for itself
                chars.append(quote)
                index += 2
                continue
            break
        if char == "\\" and escapes:
            decoded, index = _escape(text, index)
            chars.append(decoded)
            continue
        chars.append(char)
        index += 1
    value = "".join(chars)
    if prefix == "u&":
        value = _unicode_escapes(value)
    kind = "ident" if quote == '"' else ("bits" if prefix in ("b", "x") else "string")
    return Token(kind, value, position, index + 1)


def _escape(text: str, index: int) -> tuple[str, int]:
    """A backslash escape of an E'...' string at ``index``: (its character, next index)."""
    if index + 1 >= len(text):
        raise Unreadable("unterminated quoted string")
    char = text[index + 1]
    if char in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[char], index + 2
    octal = _OCTAL.match(text, index + 1)
    if octal:
        return chr(int(octal.group(0), 8)), octal.end()
    for lead, digits in (
        ("x", r"[0-9A-Fa-f]{1,2}"),
        ("u", "[0-9A-Fa-f]{4}"),
        ("U", "[0-9A-Fa-f]{8}"),
    ):
        if char == lead:
            code = re.compile(digits).match(text, index + 2)
            if code:
                return chr(int(code.group(0), 16)), code.end()
    return char, index + 2


def _unicode_escapes(value: str) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "\\\\":
            return "\\"
        return chr(int(match.group(1) or match.group(2), 16))

    return re.sub(r"\\\\|\\([0-9A-Fa-f]{4})|\\\+([0-9A-Fa-f]{6})", replace, value)


@dataclass(frozen=True)
class Piece:
    """One statement of a query string: ``text[start:end]`` runs up to its semicolon (not
    included); ``tokens`` are its tokens. A piece without tokens is empty (``;;``)."""

    start: int
    end: int
    tokens: list[Token]


def split(text: str) -> list[Piece]:
    """The statements of ``text``, split at the semicolons outside quotes and comments."""
    pieces: list[Piece] = []
    current: list[Token] = []
    start = 0
    for token in tokenize(text):
        if token.is_op(";"):
            pieces.append(Piece(start, token.start, current))
            current = []
            start = token.end
        else:
            current.append(token)
    if current or not pieces:
        pieces.append(Piece(start, len(text), current))
    return pieces
