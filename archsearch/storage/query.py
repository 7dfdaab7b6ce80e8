"""Safe trial queries: a small filter language compiled to SQLAlchemy, and trials as rows or a DataFrame.

User text never reaches `eval`, `DataFrame.query` / `DataFrame.eval` (they can run arbitrary code,
CVE-2024-9880) or SQL text: a hand-written tokenizer and recursive-descent parser accept only the
grammar below and build SQLAlchemy expressions on known columns, with every value a bound
parameter. Anything else is a `QueryError` with one line naming what is wrong and where.

The filter language (keywords are case-insensitive)::

    expr     := or_expr
    or_expr  := and_expr ("or" and_expr)*
    and_expr := not_expr ("and" not_expr)*
    not_expr := "not" not_expr | atom
    atom     := "(" expr ")"
              | COLUMN OP VALUE                              OP: = == != < <= > >=
              | COLUMN ["not"] "in" "(" VALUE ("," VALUE)* ")"
              | COLUMN "is" ["not"] "null"

- COLUMN: a column of `archsearch_trials` (see `COLUMNS`: the trial number, status, reason, the
  flat `ArchConfig` fields, costs, results and timing), or an alias: `trial` (number), `params`
  (params_total), `flops` (flops_forward_per_token) and `step_time` (step_time_s), the objective
  names of a search.
- VALUE: a number (`512`, `-1`, `0.5`, `1e6`, or with an SI suffix k, M, G, T: `2M` is
  2,000,000), a quoted string (`'x'` or `"x"`, no escapes), a bare word for string columns
  (`activation = swiglu`, `step_time_device = h100-sxm`), or `true` / `false`.
- Numeric columns take numbers and every operator; string and boolean columns take `=`, `==`,
  `!=`, `in` and `is null` only. A comparison with a missing value is false (SQL's rule): use
  `is null` / `is not null` to find them.

Example: `activation = swiglu and d_model >= 512 and status = complete`.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import DecimalException
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Boolean, ColumnElement, Float, Integer, String, and_, literal, not_, or_

from archsearch.errors import ArchsearchError, quoted
from archsearch.registry import Registry
from archsearch.space.objectives import OBJECTIVE_COLUMNS
from archsearch.storage.schema import Trial
from archsearch.units import SI_SUFFIXES, si_suffixes, si_value

if TYPE_CHECKING:
    import pandas as pd

    from archsearch.storage.db import Storage

MAX_LENGTH = 2000  # a filter is typed by a person; longer text is a mistake or an attack
MAX_DEPTH = 32  # nested parentheses and `not`s; keeps the parser's recursion and SQL small

_TABLE = Trial.__table__
# Internal bookkeeping that a filter has no use for: the row ids, the study (chosen separately)
# and the JSON blobs (their fields are flat columns already).
_NOT_FILTERABLE = ("id", "optuna_trial_id", "study", "params_json", "config_json")


def _kind(column: Any) -> str:
    stored = getattr(column.type, "impl_instance", column.type)  # schema.Real stores a Float
    if isinstance(stored, Boolean):
        return "bool"
    if isinstance(stored, Integer | Float):  # BigInteger is an Integer
        return "number"
    if isinstance(stored, String):  # Text is a String
        return "string"
    raise TypeError(f"no filter kind for column {column.name} of type {column.type}")


COLUMNS: dict[str, str] = {c.name: _kind(c) for c in _TABLE.columns if c.name not in _NOT_FILTERABLE}
"""Filterable and sortable columns and their kind: "number", "string" or "bool"."""

ALIASES: dict[str, str] = {
    "trial": "number",
    "params": "params_total",
    # the search's objectives by their names: "flops", "step_time"
    **{name: column for name, column in OBJECTIVE_COLUMNS.items() if name != column},
}

# The DataFrame's columns: who and what state first, then the table's order (the shape, costs,
# proxy-training results, hardware cost, timing), then the ids and the JSON forms.
_LEAD = ("number", "status", "reason", "attempts")
_TAIL = ("study", "id", "optuna_trial_id", "params_json", "config_json")
FRAME_COLUMNS: tuple[str, ...] = (
    *_LEAD,
    *(c.name for c in _TABLE.columns if c.name not in _LEAD + _TAIL),
    *_TAIL,
)
"""Every column of `archsearch_trials`, in the order `trials_frame` returns them."""

_KIND_WORDS = {"number": "numeric", "string": "string", "bool": "boolean"}
_KEYWORDS = frozenset({"and", "or", "not", "in", "is", "null", "true", "false"})
_OPS = ("=", "==", "!=", "<", "<=", ">", ">=")
_EQUALITY_OPS = ("=", "==", "!=")
_INT_LIMIT = 2**63  # beyond a signed 64-bit integer, a bound value is sent as a float


class QueryError(ArchsearchError, ValueError):
    """A filter, sort key or limit that is not valid; the one-line message says where."""


# ------------------------------------------------------------------------------------------------
# Tokens
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    kind: str  # "(", ")", ",", "op", "number", "string", "word" or "end"
    text: str  # as written
    pos: int  # character offset in the filter, from 0
    value: Any = None  # the number or the string's contents

    def describe(self) -> str:
        if self.kind == "string":  # already quoted; control characters were refused earlier
            return "the string " + (self.text if len(self.text) <= 40 else self.text[:37] + "...")
        return "the end" if self.kind == "end" else quoted(self.text)

    def is_keyword(self, *names: str) -> bool:
        return self.kind == "word" and self.text.lower() in names


# re.ASCII: `\d` and `\s` mean ASCII digits and whitespace, not every Unicode digit and space.
_TOKEN = re.compile(
    r"""
      (?P<space>\s+)
    | (?P<punct>[(),])
    | (?P<op>==|!=|<=|>=|=|<|>)
    | (?P<string>'[^']*'|"[^"]*")
    | (?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?P<suffix>[A-Za-z_]\w*)?
    | (?P<word>[A-Za-z_][\w.:/-]*)
    """,
    re.VERBOSE | re.ASCII,
)


def _tokens(text: str) -> Iterator[_Token]:
    """The tokens of `text`, lazily: an error is reported where the parser meets it, in order."""
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            char = text[pos]
            if char in "'\"":
                raise QueryError(f"unterminated string starting at position {pos}")
            raise QueryError(f"unexpected character {quoted(char)} at position {pos}")
        kind = m.lastgroup if m.lastgroup != "suffix" else "number"
        end = m.end()
        if kind in ("number", "word") and end < len(text) and text[end].isalnum():
            # a non-ASCII letter or digit inside a name (`d_modèl`, a Cyrillic o): name it, not
            # the ASCII part before it
            raise QueryError(f"unexpected character {quoted(text[end])} at position {end}")
        if kind == "punct":
            yield _Token(m.group(), m.group(), pos)
        elif kind == "string":
            yield _Token("string", m.group(), pos, m.group()[1:-1])
        elif kind == "number":
            yield _Token("number", m.group(), pos, _number(m.group("number"), m.group("suffix"), pos))
        elif kind != "space":
            yield _Token(kind, m.group(), pos)  # type: ignore[arg-type]
        pos = end
    yield _Token("end", "", len(text))


def _number(digits: str, suffix: str | None, pos: int) -> int | float:
    suffix = suffix or ""
    if suffix and suffix not in SI_SUFFIXES:
        raise QueryError(
            f"malformed number {quoted(digits + suffix)} at position {pos}: a number may end in "
            f"{si_suffixes()}; quote strings that start with a digit"
        )
    try:
        # Decimal keeps `1.1M` exact: 1100000, not 1100000.0000000002.
        value = si_value(digits, suffix)
    except DecimalException:  # an exponent beyond Decimal's range
        raise QueryError(f"number {quoted(digits + suffix)} at position {pos} is out of range") from None
    if value == value.to_integral_value() and abs(value) < _INT_LIMIT:
        return int(value)
    as_float = float(value)
    if not math.isfinite(as_float):
        raise QueryError(f"number {quoted(digits + suffix)} at position {pos} is out of range")
    return as_float


# ------------------------------------------------------------------------------------------------
# The parser: recursive descent over the grammar in the module docstring
# ------------------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self._tokens = _tokens(text)
        self.tok = next(self._tokens)  # the one token of lookahead the grammar needs

    def advance(self) -> _Token:
        tok = self.tok
        self.tok = next(self._tokens)
        return tok

    def parse(self) -> ColumnElement[bool]:
        if self.tok.kind == "end":
            raise QueryError("empty filter: give a condition such as `d_model >= 512`")
        expr = self.or_expr(0)
        if self.tok.kind == ")":
            raise QueryError(f"unbalanced parenthesis: ')' at position {self.tok.pos} closes nothing")
        if self.tok.kind != "end":
            raise QueryError(
                f"expected 'and', 'or' or the end at position {self.tok.pos}, found {self.tok.describe()}"
            )
        return expr

    def or_expr(self, depth: int) -> ColumnElement[bool]:
        terms = [self.and_expr(depth)]
        while self.tok.is_keyword("or"):
            self.advance()
            terms.append(self.and_expr(depth))
        return terms[0] if len(terms) == 1 else or_(*terms)

    def and_expr(self, depth: int) -> ColumnElement[bool]:
        terms = [self.not_expr(depth)]
        while self.tok.is_keyword("and"):
            self.advance()
            terms.append(self.not_expr(depth))
        return terms[0] if len(terms) == 1 else and_(*terms)

    def not_expr(self, depth: int) -> ColumnElement[bool]:
        if self.tok.is_keyword("not"):
            self.deeper(depth)
            self.advance()
            return not_(self.not_expr(depth + 1))
        return self.atom(depth)

    def deeper(self, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise QueryError(f"filter nested deeper than {MAX_DEPTH} levels at position {self.tok.pos}")

    def atom(self, depth: int) -> ColumnElement[bool]:
        if self.tok.kind == "(":
            self.deeper(depth)
            opening = self.advance()
            expr = self.or_expr(depth + 1)
            if self.tok.kind != ")":
                if self.tok.kind == "end":
                    raise QueryError(f"unbalanced parenthesis: '(' at position {opening.pos} is never closed")
                raise QueryError(
                    f"expected ')', 'and' or 'or' at position {self.tok.pos}, found {self.tok.describe()}"
                )
            self.advance()
            return expr
        name, kind = self.column()
        column = _TABLE.c[name]
        tok = self.tok
        if tok.kind == "op":
            op = self.advance().text
            if kind != "number" and op not in _EQUALITY_OPS:
                raise QueryError(
                    f"operator '{op}' at position {tok.pos} does not apply to the {_KIND_WORDS[kind]} column "
                    f"'{name}'; use = or !="
                )
            value = self.value(name, kind, after=op)
            return _compare(column, op, value)
        if tok.is_keyword("is"):
            self.advance()
            negate = self.tok.is_keyword("not")
            if negate:
                self.advance()
            if not self.tok.is_keyword("null"):
                raise QueryError(
                    f"expected 'null' after 'is{' not' if negate else ''}' at position {self.tok.pos}, "
                    f"found {self.tok.describe()}"
                )
            self.advance()
            return column.is_not(None) if negate else column.is_(None)
        if tok.is_keyword("not", "in"):
            negate = tok.is_keyword("not")
            if negate:
                self.advance()
                if not self.tok.is_keyword("in"):
                    raise QueryError(
                        f"expected 'in' after 'not' at position {self.tok.pos}, found {self.tok.describe()}"
                    )
            keyword = "not in" if negate else "in"
            self.advance()
            if self.tok.kind != "(":
                raise QueryError(
                    f"expected '(' after '{keyword}' at position {self.tok.pos}, found {self.tok.describe()}"
                )
            self.advance()
            values = [self.value(name, kind, after="(")]
            while self.tok.kind == ",":
                self.advance()
                values.append(self.value(name, kind, after=","))
            if self.tok.kind != ")":
                raise QueryError(
                    f"expected ',' or ')' in the '{keyword}' list at position {self.tok.pos}, "
                    f"found {self.tok.describe()}"
                )
            self.advance()
            condition = column.in_([_bound(v) for v in values])
            return not_(condition) if negate else condition
        raise QueryError(
            f"expected an operator ({' '.join(_OPS)}, in, is) after '{name}' at position {tok.pos}, "
            f"found {tok.describe()}"
        )

    def column(self) -> tuple[str, str]:
        tok = self.tok
        if tok.kind != "word" or tok.text.lower() in _KEYWORDS:
            raise QueryError(f"expected a column name at position {tok.pos}, found {tok.describe()}")
        given = tok.text.lower()
        name = ALIASES.get(given, given)
        if name not in COLUMNS:
            valid = [*COLUMNS, *ALIASES]
            close = difflib.get_close_matches(given, valid, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise QueryError(
                f"unknown column {quoted(tok.text)} at position {tok.pos}{hint}; valid: {', '.join(valid)}"
            )
        self.advance()
        return name, COLUMNS[name]

    def value(self, name: str, kind: str, after: str) -> Any:
        tok = self.tok
        if tok.is_keyword("null"):
            raise QueryError(f"compare with null using 'is null' or 'is not null' (position {tok.pos})")
        if tok.kind not in ("number", "string", "word") or tok.text.lower() in _KEYWORDS - {"true", "false"}:
            raise QueryError(
                f"expected a value after '{after}' at position {tok.pos}, found {tok.describe()}"
            )
        self.advance()
        if kind == "number":
            if tok.kind != "number":
                raise QueryError(
                    f"'{name}' is a numeric column: expected a number at position {tok.pos}, "
                    f"found {tok.describe()}"
                )
            return tok.value
        if kind == "bool":
            if not tok.is_keyword("true", "false"):
                raise QueryError(
                    f"'{name}' is a boolean column: expected true or false at position {tok.pos}, "
                    f"found {tok.describe()}"
                )
            return tok.text.lower() == "true"
        if tok.kind == "number":
            raise QueryError(
                f"'{name}' is a string column: found the number {tok.text} at position {tok.pos}; quote it"
            )
        return tok.value if tok.kind == "string" else tok.text


def _bound(value: Any) -> ColumnElement[Any]:
    """A bound parameter typed by the value, not the column: `d_model > 1.5` must not cast 1.5
    to INTEGER (PostgreSQL drivers send typed parameters)."""
    if isinstance(value, bool):
        return literal(value, Boolean())
    if isinstance(value, int):
        return literal(value, BigInteger())
    if isinstance(value, float):
        return literal(value, Float())
    return literal(value, String())


_COMPARE: dict[str, Callable[[Any, Any], ColumnElement[bool]]] = {
    "=": lambda c, v: c == v,
    "==": lambda c, v: c == v,
    "!=": lambda c, v: c != v,
    "<": lambda c, v: c < v,
    "<=": lambda c, v: c <= v,
    ">": lambda c, v: c > v,
    ">=": lambda c, v: c >= v,
}


def _compare(column: Any, op: str, value: Any) -> ColumnElement[bool]:
    return _COMPARE[op](column, _bound(value))


def compile_filter(text: str) -> ColumnElement[bool]:
    """Parse a filter (grammar in the module docstring) into a SQLAlchemy boolean expression.

    The expression refers to the `archsearch_trials` table; every value is a bound parameter.

    Raises:
        QueryError: the text is empty, too long, nested too deep, has a character, word or
            value the grammar does not allow, or compares a column with a value of another type.
    """
    if len(text) > MAX_LENGTH:
        raise QueryError(f"filter is {len(text):,} characters long; the limit is {MAX_LENGTH:,}")
    for pos, char in enumerate(text):
        if not char.isprintable() and char not in " \t\r\n":  # NUL, escapes, bidi overrides
            raise QueryError(f"control character {char!a} at position {pos}")
    return _Parser(text).parse()


# ------------------------------------------------------------------------------------------------
# Trials as a DataFrame
# ------------------------------------------------------------------------------------------------


def _order_by(sort: str) -> list[ColumnElement[Any]]:
    key = sort.strip()
    descending = key.startswith("-")
    given = key[1:].strip().lower() if descending else key.lower()
    name = ALIASES.get(given, given)
    if name not in COLUMNS:
        close = difflib.get_close_matches(given, [*COLUMNS, *ALIASES], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise QueryError(
            f"unknown sort column {quoted(sort)}{hint}; give a column, or -column for descending: "
            f"{', '.join([*COLUMNS, *ALIASES])}"
        )
    column = _TABLE.c[name]
    # Missing values last in both directions, on every backend.
    return [column.is_(None), column.desc() if descending else column]


def _dtype(column: Any) -> str:
    # Nullable dtypes: a missing d_model stays an integer column, not floats with NaN.
    kind = _kind(column)
    if kind == "bool":
        return "boolean"
    if kind == "string":
        # Python storage: pandas' pyarrow-backed default costs an import of pyarrow.compute
        # (about 40 ms) in every process that builds a frame, for no gain on a few thousand rows.
        return "string[python]"
    return "Int64" if isinstance(column.type, Integer) else "float64"


@dataclass(frozen=True)
class TrialTable:
    """A study's trials as SQL returned them: one tuple per trial, Python scalars, None missing.

    What `trials` writes as CSV or JSON, without pandas (whose import is a third of a `trials`
    process); `frame()` gives the DataFrame.

    Attributes:
        columns: `FRAME_COLUMNS`.
        rows: one tuple per trial, in the query's order.
    """

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def __len__(self) -> int:
        return len(self.rows)

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame: integer and boolean columns in pandas' nullable dtypes (Int64,
        boolean), strings in the `string` dtype."""
        import pandas as pd

        values = list(zip(*self.rows, strict=True)) if self.rows else [() for _ in self.columns]
        return pd.DataFrame(
            {
                name: pd.array(list(column), dtype=_RANKED_DTYPES.get(name) or _dtype(_TABLE.c[name]))
                for name, column in zip(self.columns, values, strict=True)
            }
        )


def trials_table(
    storage: Storage,
    study: str,
    where: str | None = None,
    sort: str | None = None,
    limit: int | None = None,
    ranked: bool = False,
) -> TrialTable:
    """A study's trials: one SQL query with the filter, order and limit.

    Args:
        storage: an open trial database.
        study: the study's name.
        where: a filter in the language of the module docstring, e.g.
            `"activation = swiglu and d_model >= 512 and status = complete"`; None for all.
        sort: a column to sort by, `-column` for descending; missing values last. Ties, and
            the default order, go by trial number.
        limit: at most this many trials (after filtering and sorting).
        ranked: add `RANKED_COLUMNS`: each complete trial's loss objective as a front ranks it and
            the tokens it is ranked at and whether it is estimated there (`Storage.ranked_objectives`:
            a promoted contender's measured at the largest budget every contender reached, any
            other trial's estimated at that budget); None for the trials not complete.

    Returns:
        The columns of `FRAME_COLUMNS` in that order: number, status, reason, attempts, the
        shape, its exact costs, proxy-training results, hardware cost, timing, then study, the
        row ids and the JSON forms; then, `ranked`, `RANKED_COLUMNS`.

    Raises:
        QueryError: a malformed filter, an unknown sort column or a negative limit.
        UnknownNameError: no study of that name (the message lists the database's studies).
        StorageError: the database cannot be read.
    """
    condition = compile_filter(where) if where is not None else None
    order = _order_by(sort) if sort is not None else []
    if limit is not None and limit < 0:
        raise QueryError(f"limit must be 0 or more, not {limit}")
    storage.require_study(study)
    if limit is not None and limit >= _INT_LIMIT:
        limit = None  # more than any table holds, and more than SQLite's integers can say
    rows = storage.trial_rows(study, FRAME_COLUMNS, where=condition, order_by=order, limit=limit)
    if not ranked:
        return TrialTable(FRAME_COLUMNS, rows)
    by_number = storage.ranked_objectives(study)
    missing = (None,) * len(RANKED_COLUMNS)
    return TrialTable(
        (*FRAME_COLUMNS, *RANKED_COLUMNS), [(*row, *by_number.get(row[0], missing)) for row in rows]
    )


RANKED_COLUMNS = ("objective", "budget_tokens", "estimated")
_RANKED_DTYPES = {"objective": "float64", "budget_tokens": "Int64", "estimated": "boolean"}


def trials_frame(
    storage: Storage,
    study: str,
    where: str | None = None,
    sort: str | None = None,
    limit: int | None = None,
    ranked: bool = False,
) -> pd.DataFrame:
    """`trials_table` as a DataFrame (`TrialTable.frame`): same arguments, same errors."""
    return trials_table(storage, study, where, sort, limit, ranked).frame()


# ------------------------------------------------------------------------------------------------
# File formats
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableFormat:
    """How trials are written to a file or stdout.

    Attributes:
        encode: the trials to bytes.
        binary: not text: needs a file, never a terminal.
    """

    encode: Callable[[TrialTable], bytes]
    binary: bool


def missing(value: Any) -> bool:
    """None, or a float NaN: what pandas calls NA in a row of a `TrialTable`."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _rows(table: TrialTable) -> Iterator[tuple[Any, ...]]:
    """The rows with None for every missing value (a NaN float included)."""
    return (tuple(None if missing(v) else v for v in row) for row in table.rows)


def _csv(table: TrialTable) -> bytes:
    # The csv module writes what pandas' to_csv writes here: repr floats, True / False, an empty
    # field for a missing value, minimal quoting, "\n" line ends.
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.columns)
    writer.writerows(_rows(table))
    return out.getvalue().encode()


def _json(table: TrialTable) -> bytes:
    # Our own encoding, not pandas' `to_json`: that rounds floats to 10 significant digits.
    # One record per line: readable, and json's C encoder runs only without `indent`.
    # JSON has no Infinity: a stored +-inf (a failed trial's bits_per_byte) is null, as NaN is.
    names = table.columns
    rows = (
        tuple(None if isinstance(v, float) and not math.isfinite(v) else v for v in row)
        for row in _rows(table)
    )
    lines = (json.dumps(dict(zip(names, row, strict=True)), allow_nan=False) for row in rows)
    return ("[\n" + ",\n".join(lines) + "\n]\n").encode()


def _parquet(table: TrialTable) -> bytes:
    buffer = io.BytesIO()
    try:
        table.frame().to_parquet(buffer, index=False)
    except ImportError as exc:
        raise QueryError(f"parquet needs pyarrow (pip install pyarrow): {exc}") from None
    return buffer.getvalue()


FORMATS: Registry[TableFormat] = Registry("format")
FORMATS.register("csv", TableFormat(_csv, binary=False))
FORMATS.register("json", TableFormat(_json, binary=False))  # a list of records
FORMATS.register("parquet", TableFormat(_parquet, binary=True))
