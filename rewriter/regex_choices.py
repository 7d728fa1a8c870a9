"""Whether a regular expression's alternations choose alike in PostgreSQL and Java.

Where the matched text is returned, PostgreSQL (POSIX "advanced" REs, all quantifiers
greedy) takes the *longest* match at the leftmost position where any match starts, and
Java (Spark) the *first* in its backtracking order at that same position. The two agree
when the pattern is deterministic in this sense, checked at every choice point
(an alternation, a quantifier that may repeat again or stop):

- the characters that can come next after each option (its FIRST set, followed by what
  follows the choice point in the pattern) are disjoint, so the next input character
  leaves at most one option that consumes it;
- at most one option can end the match right there without consuming anything, and it
  is the one Java tries last (a quantifier's "stop", an alternation's last branch).

Then, at the chosen position, the matches form one chain along one path: Java prefers
every option that consumes a character over the one that ends the match, so it finds
the longest match, as PostgreSQL does, and by the same (only) path, so every capture
group holds the same text. The sets are over-approximations (``^``, ``$`` are taken as
matching anywhere, ``\\d`` ``\\w`` ``\\s`` as also matching any non-ASCII character,
``\\D`` ``\\W`` ``\\S`` any character), which can only make the check refuse more.

Nexmark q21's ``(&|^)channel_id=([^&]*)`` passes: one alternative starts with ``&``, the
other (``^``, matching nothing) is followed by ``c``. ``(a|ab)`` does not: both
alternatives start with ``a``, and on "ab" PostgreSQL gives ``ab``, Java ``a``.

A capture group inside an alternative is refused apart (capture_in_alternative): when
another alternative is taken PostgreSQL gives NULL for it, Spark an empty string.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_CHAR = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]  # sorted, disjoint, inclusive code point ranges


def _ranges(pairs: list[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(pairs):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _union(a: Ranges, b: Ranges) -> Ranges:
    return _ranges([*a, *b])


def _overlap(a: Ranges, b: Ranges) -> bool:
    return any(lo1 <= hi2 and lo2 <= hi1 for lo1, hi1 in a for lo2, hi2 in b)


def _complement(a: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    start = 0
    for lo, hi in a:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CHAR:
        out.append((start, MAX_CHAR))
    return tuple(out)


ANY: Ranges = ((0, MAX_CHAR),)
_NON_ASCII = (0x80, MAX_CHAR)
_CLASS_SETS: dict[str, Ranges] = {
    "d": _ranges([(ord("0"), ord("9")), _NON_ASCII]),
    "w": _ranges([(48, 57), (65, 90), (97, 122), (95, 95), _NON_ASCII]),
    "s": _ranges([(9, 13), (32, 32), _NON_ASCII]),
    "D": ANY,
    "W": ANY,
    "S": ANY,
}


@dataclass(frozen=True)
class Next:
    """What can come next at a point of the pattern: a character of ``chars``, or the
    end of the match (``ends``)."""

    chars: Ranges
    ends: bool

    def then(self, follow: Next) -> Next:
        """``self`` for a part that may match empty (``ends``), followed by ``follow``."""
        if not self.ends:
            return self
        return Next(_union(self.chars, follow.chars), follow.ends)

    def __or__(self, other: Next) -> Next:
        return Next(_union(self.chars, other.chars), self.ends or other.ends)


EMPTY = Next((), True)


class Nondeterministic(Exception):
    """A choice point where the engines may choose differently; the message names it."""


# ---- the pattern as a tree ------------------------------------------------------------


@dataclass(frozen=True)
class Chars:
    chars: Ranges


@dataclass(frozen=True)
class Seq:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class Capture:
    body: Node


@dataclass(frozen=True)
class Alt:
    branches: tuple[Node, ...]
    text: str  # as written, for messages


@dataclass(frozen=True)
class Repeat:
    body: Node
    least: int
    most: int | None
    text: str


Node = Chars | Seq | Capture | Alt | Repeat


def parse(pattern: str) -> Node:
    """The tree of a pattern already checked by text_patterns.regex (groups become the
    tree's shape; assertions, which match no character, become empty sequences)."""
    node, k = _alternation(pattern, 0)
    assert k == len(pattern), pattern
    return node


def _alternation(p: str, k: int) -> tuple[Node, int]:
    start = k
    branches = []
    node, k = _sequence(p, k)
    branches.append(node)
    while k < len(p) and p[k] == "|":
        node, k = _sequence(p, k + 1)
        branches.append(node)
    if len(branches) == 1:
        return branches[0], k
    return Alt(tuple(branches), p[start:k]), k


def _sequence(p: str, k: int) -> tuple[Node, int]:
    parts: list[Node] = []
    while k < len(p) and p[k] not in "|)":
        start = k
        atom, k = _atom(p, k)
        while k < len(p) and p[k] in "*+?{":
            least, most, k = _quantifier(p, k)
            atom = Repeat(atom, least, most, p[start:k])
        parts.append(atom)
    return Seq(tuple(parts)), k


def _atom(p: str, k: int) -> tuple[Node, int]:
    c = p[k]
    if c == "(":
        capturing = not p.startswith("(?:", k)
        node, k = _alternation(p, k + (1 if capturing else 3))
        return (Capture(node) if capturing else node), k + 1  # the )
    if c in "^$":
        return Seq(()), k + 1
    if c == ".":
        return Chars(ANY), k + 1
    if c == "[":
        return _bracket(p, k)
    if c == "\\":
        nxt = p[k + 1]
        return Chars(_CLASS_SETS.get(nxt, ((ord(nxt), ord(nxt)),))), k + 2
    return Chars(((ord(c), ord(c)),)), k + 1


def _bracket(p: str, k: int) -> tuple[Node, int]:
    k += 1
    negated = p[k] == "^"
    if negated:
        k += 1
    pairs: list[tuple[int, int]] = []
    approximate = False  # a class escape's set is a superset: its complement is not
    while p[k] != "]":
        if p[k] == "\\":
            nxt = p[k + 1]
            if nxt in _CLASS_SETS:
                pairs.extend(_CLASS_SETS[nxt])
                approximate = True
            else:
                pairs.append((ord(nxt), ord(nxt)))
            k += 2
            continue
        if k + 2 < len(p) and p[k + 1] == "-" and p[k + 2] != "]":
            hi = p[k + 3] if p[k + 2] == "\\" else p[k + 2]
            pairs.append((ord(p[k]), ord(hi)))
            k += 4 if p[k + 2] == "\\" else 3
            continue
        pairs.append((ord(p[k]), ord(p[k])))
        k += 1
    chars = _ranges(pairs)
    if negated:
        chars = ANY if approximate else _complement(chars)
    return Chars(chars), k + 1


def _quantifier(p: str, k: int) -> tuple[int, int | None, int]:
    c = p[k]
    if c == "*":
        return 0, None, k + 1
    if c == "+":
        return 1, None, k + 1
    if c == "?":
        return 0, 1, k + 1
    end = p.index("}", k)
    least, _, most = p[k + 1 : end].partition(",")
    if "," not in p[k + 1 : end]:
        return int(least), int(least), end + 1
    return int(least), (int(most) if most else None), end + 1


# ---- the check ------------------------------------------------------------------------


def first(node: Node) -> Next:
    """What a match of ``node`` can start with (``ends``: it can match empty)."""
    if isinstance(node, Chars):
        return Next(node.chars, False)
    if isinstance(node, Seq):
        out = EMPTY
        for part in reversed(node.parts):
            out = first(part).then(out)
        return out
    if isinstance(node, Capture):
        return first(node.body)
    if isinstance(node, Alt):
        out = Next((), False)
        for branch in node.branches:
            out = out | first(branch)
        return out
    body = first(node.body)
    return Next(body.chars, body.ends or node.least == 0)


def check_choices(pattern: str) -> None:
    """Raise Nondeterministic naming the first choice point where PostgreSQL's longest
    match and Java's first match may differ."""
    _check(parse(pattern), EMPTY)


def _check(node: Node, follow: Next) -> None:
    if isinstance(node, Chars):
        return
    if isinstance(node, Seq):
        after = follow
        for part in reversed(node.parts):
            _check(part, after)
            after = first(part).then(after)
        return
    if isinstance(node, Capture):
        _check(node.body, follow)
        return
    if isinstance(node, Alt):
        options = [first(branch).then(follow) for branch in node.branches]
        for i, option in enumerate(options):
            for other in options[i + 1 :]:
                if _overlap(option.chars, other.chars):
                    raise Nondeterministic(
                        f"the alternatives of {node.text!r} can match at the same place"
                    )
            if option.ends and i < len(options) - 1:
                raise Nondeterministic(
                    f"an alternative of {node.text!r} other than the last can match nothing"
                )
        for branch in node.branches:
            _check(branch, follow)
        return
    body = first(node.body)
    again = node.most is None or node.most > 1
    inner = follow | body if again else follow
    if node.most is None or node.most > node.least:
        repeat = body.then(inner)
        if _overlap(repeat.chars, follow.chars) or repeat.ends:
            raise Nondeterministic(
                f"{node.text!r} can repeat or stop on the same character"
                if not repeat.ends
                else f"{node.text!r} repeats something that can match nothing"
            )
    _check(node.body, inner)


def capture_in_alternative(pattern: str) -> str | None:
    """The first alternation (as written) with a capture group in an alternative."""
    return _capture_in_alternative(parse(pattern))


def _captures(node: Node) -> bool:
    if isinstance(node, Capture):
        return True
    if isinstance(node, Chars):
        return False
    if isinstance(node, Seq):
        return any(_captures(part) for part in node.parts)
    if isinstance(node, Alt):
        return any(_captures(branch) for branch in node.branches)
    return _captures(node.body)


def _capture_in_alternative(node: Node) -> str | None:
    if isinstance(node, Chars):
        return None
    if isinstance(node, Alt) and any(_captures(branch) for branch in node.branches):
        return node.text
    children: tuple[Node, ...]
    if isinstance(node, Seq):
        children = node.parts
    elif isinstance(node, Alt):
        children = node.branches
    else:
        children = (node.body,)
    for child in children:
        found = _capture_in_alternative(child)
        if found is not None:
            return found
    return None
