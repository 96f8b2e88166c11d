"""Row filters on Parquet and Arrow columns (data.sources.NAME.where): comparisons of a column
with a literal, joined by and/or, in parentheses where needed, e.g.

    language_score >= 0.9 and (dump == 'CC-MAIN-2024-10' or int_score > 2)

Parsed by a small recursive-descent parser (never eval) into a tree, checked when the config
is; pipeline.data.columnar evaluates it on each batch with pyarrow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TOKEN = re.compile(
    r"\s*(?:(?P<number>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(?P<string>'[^']*'|\"[^\"]*\")"
    r"|(?P<op>==|!=|>=|<=|>|<|\(|\))|(?P<name>[A-Za-z_][A-Za-z0-9_]*))"
)
OPS = {"==": "equal", "!=": "not_equal", ">=": "greater_equal", "<=": "less_equal",
       ">": "greater", "<": "less"}  # fmt: skip
KEYWORDS = {"and", "or", "true", "false"}


class BadFilter(ValueError):
    """A filter expression that does not parse; the message says where."""


@dataclass(frozen=True)
class Compare:
    column: str
    op: str
    value: object


@dataclass(frozen=True)
class Join:
    op: str  # and | or
    left: Compare | Join
    right: Compare | Join


Filter = Compare | Join


def _tokens(text: str) -> list[tuple[str, str]]:
    found, position = [], 0
    text = text.rstrip()
    while position < len(text):
        match = TOKEN.match(text, position)
        if not match or match.end() == position:
            raise BadFilter(f"cannot read {text[position:].strip()[:20]!r} (character {position})")
        kind = match.lastgroup
        found.append((kind, match.group(kind)))
        position = match.end()
    return found


def parse(text: str) -> Filter:
    """The tree of `text`, or BadFilter naming what is wrong."""
    tokens = _tokens(text)
    position = 0

    def peek() -> tuple[str, str] | None:
        return tokens[position] if position < len(tokens) else None

    def take() -> tuple[str, str]:
        nonlocal position
        if position >= len(tokens):
            raise BadFilter("ends too early")
        position += 1
        return tokens[position - 1]

    def joined(op: str, operand) -> Filter:
        left = operand()
        while peek() == ("name", op):
            take()
            left = Join(op, left, operand())
        return left

    def disjunction() -> Filter:
        return joined("or", conjunction)

    def conjunction() -> Filter:
        return joined("and", comparison)

    def comparison() -> Filter:
        kind, value = take()
        if (kind, value) == ("op", "("):
            inner = disjunction()
            if take() != ("op", ")"):
                raise BadFilter("a '(' is not closed")
            return inner
        if kind != "name" or value in KEYWORDS:
            raise BadFilter(f"expected a column name, found {value!r}")
        op_kind, op = take()
        if op_kind != "op" or op not in OPS:
            raise BadFilter(f"expected one of {' '.join(OPS)} after {value}, found {op!r}")
        return Compare(value, op, literal(*take()))

    def literal(kind: str, value: str) -> object:
        if kind == "number":
            return float(value) if any(c in value for c in ".eE") else int(value)
        if kind == "string":
            return value[1:-1]
        if value in ("true", "false"):
            return value == "true"
        raise BadFilter(f"expected a number, a 'string', true or false, found {value!r}")

    tree = disjunction()
    if peek() is not None:
        raise BadFilter(f"unexpected {peek()[1]!r}")
    return tree


def columns(tree: Filter) -> list[str]:
    """The columns a filter reads, in order of appearance."""
    if isinstance(tree, Compare):
        return [tree.column]
    return list(dict.fromkeys(columns(tree.left) + columns(tree.right)))
