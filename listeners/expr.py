"""Compiled CEL filters and converters for listeners.

Expressions are compiled once, at registration, with the Rust-backed ``cel`` package (see
``benchmarks/cel_candidates.py`` for why): syntax errors, unknown variables, unknown functions
and obviously mistyped results are refused there with a 0-based ``position``. A compiled
expression also knows which variables and which top-level fields of ``value``/``old`` it reads,
so the caller builds a context with just those (the context build, not the evaluation,
dominates the cost per change).

Expressions see ``key`` (string), ``value`` (the entity map, or null), ``old`` (the previous
map, or null), ``kind`` (``created``/``modified``/``removed``) and ``meta`` (``partition``,
``offset``, ``timestamp``, ``version``, ``type``). No Python code is ever evaluated.

Expressions run for every change on the worker's poll thread, so their static cost is bounded
at registration (:mod:`listeners.cost`): an expression over a limit is refused with the reason
and the position; an accepted one carries its estimate as :attr:`CompiledExpr.cost`.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cel

from fifolane.errors import ExpressionError
from listeners._lexer import LexError, Token, tokenize
from listeners._parser import Lit, MapLit, Node, ParseError, Unary, parse
from listeners.analysis import WHOLE, EqualityConjunct, analyse, result_shape
from listeners.cost import (
    LIMITS,
    CostLimitError,
    check_source,
    check_tokens,
    check_tree,
    children,
    estimate,
    estimate_unparsed,
)
from listeners.native import Comparison, NativeFn, filter_terms, native_converter, native_filter

__all__ = [
    "LIMITS",
    "VARIABLES",
    "CompiledExpr",
    "EvaluationError",
    "compile_converter",
    "compile_filter",
    "normalize",
]

#: The only top-level names an expression may use.
VARIABLES = ("key", "value", "old", "kind", "meta")

# Functions the `cel` 0.10 runtime implements (probed; anything else fails at run time with
# "Undefined variable or function", so it is refused at registration instead).
_FUNCTIONS = frozenset(
    {
        "size", "int", "uint", "double", "string", "bytes", "type", "dyn", "duration",
        "timestamp", "matches", "contains", "startsWith", "endsWith", "all", "exists",
        "exists_one", "map", "filter", "getFullYear", "getMonth", "getDate", "getDayOfMonth",
        "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
        "getMilliseconds",
    }
)  # fmt: skip

_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*)")


class EvaluationError(ExpressionError):
    """An expression failed at run time (missing field, type mismatch, non-bool filter result).

    Not fatal: the matcher counts it against the listener and carries on.
    """


def _offset(src: str, line: int, column: int) -> int:
    """0-based offset of a 1-based (line, column) pair, columns counted in code points."""
    lines = src.split("\n")
    before = sum(len(x) + 1 for x in lines[: max(line - 1, 0)])
    return min(before + max(column - 1, 0), len(src))


def _syntax_error(role: str, src: str, exc: BaseException) -> ExpressionError:
    text = str(exc)
    m = _POSITION.search(text)
    if m is None:
        return ExpressionError(f"invalid {role}: {text}", expression=src, position=None)
    line, col, detail = int(m.group(1)), int(m.group(2)), m.group(3)
    hint = ""
    if "'= '" in detail or "at: '='" in detail:
        hint = "; use '==' to compare"
    elif "'&'" in detail or "'|'" in detail:
        hint = "; use '&&' / '||' for and / or"
    return ExpressionError(
        f"invalid {role} at line {line}, column {col}: {detail}{hint}",
        expression=src,
        position=_offset(src, line, col),
    )


def normalize(src: str, tokens: list[Token] | None = None) -> str:
    """Canonical text of an expression: tokens joined by one space (comments dropped).

    Two filters with the same normal form are evaluated once per change.
    """
    try:
        toks = tokens if tokens is not None else tokenize(src)
    except LexError:
        return src.strip()
    return " ".join(t.text for t in toks if t.kind != "eof")


@dataclass(frozen=True, slots=True)
class Equality:
    """An indexable ``value.<path> == <literal>`` conjunct of a filter."""

    path: tuple[str, ...]
    literal: Any
    rest: CompiledExpr | None


class CompiledExpr:
    """A compiled filter or converter and what it references.

    ``variables``: the top-level names used. ``fields``: for ``value`` and ``old`` (if used),
    the set of top-level field names read, or ``None`` when the whole map is needed.
    ``equality``: for filters, the indexable equality conjunct, if any. ``cost``: the static
    estimate of its evaluation steps (:func:`listeners.cost.estimate`; about 1 µs each),
    at most ``LIMITS.max_cost``.
    """

    __slots__ = ("comparisons", "cost", "equality", "fields", "native", "normalized", "program", "role",
                 "source", "variables")  # fmt: skip

    def __init__(
        self,
        source: str,
        role: str,
        program: Any,
        variables: frozenset[str],
        fields: Mapping[str, frozenset[str] | None],
        equality: Equality | None = None,
        normalized: str | None = None,
        native: NativeFn | None = None,
        comparisons: tuple[Comparison, ...] | None = None,
        cost: int = 0,
    ) -> None:
        self.source = source
        self.cost = cost
        self.role = role
        self.program = program
        self.normalized = normalized if normalized is not None else normalize(source)
        self.variables = variables
        self.fields = dict(fields)
        self.equality = equality
        #: A plain-Python closure for simple shapes (:mod:`listeners.native`), or None.
        self.native = native
        #: For a filter that is a ``&&`` chain of native comparisons: those comparisons
        #: (the matcher evaluates filters that differ only in literals together).
        self.comparisons = comparisons

    def __repr__(self) -> str:
        return f"CompiledExpr({self.role}: {self.source!r})"

    # Never mutated after compiling, so copies share it; pickling compiles the source again
    # (its CEL program and native closure cannot be pickled). A ListenerSpec carries one.
    def __copy__(self) -> CompiledExpr:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledExpr:
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return _compile, (self.source, self.role)

    @property
    def is_state_filter(self) -> bool:
        """True if the result depends only on the entity state (not on ``old`` or ``kind``).

        Only such filters define a view; the matcher evaluates them on the old and new state.
        """
        return not ({"old", "kind"} & self.variables)

    def evaluate(self, context: Any) -> Any:
        """Run on a ``cel.Context`` (or a dict); raise :class:`EvaluationError` on failure."""
        try:
            return self.program.execute(context)
        except Exception as exc:  # the binding raises KeyError/TypeError/ValueError/RuntimeError...
            raise EvaluationError(
                f"{self.role} {self.source!r} failed: {type(exc).__name__}: {exc}",
                expression=self.source,
            ) from exc

    def test(self, context: Any) -> bool:
        """Evaluate a filter; a non-bool result is an :class:`EvaluationError`."""
        result = self.evaluate(context)
        if result is True or result is False:
            return result
        raise EvaluationError(
            f"filter {self.source!r} returned {type(result).__name__}, not a bool",
            expression=self.source,
        )

    def project(self, context: Any) -> dict[str, Any]:
        """Evaluate a converter; a result that is not a map is an :class:`EvaluationError`."""
        result = self.evaluate(context)
        if isinstance(result, dict):
            return result
        raise EvaluationError(
            f"converter {self.source!r} returned {type(result).__name__}, not a map",
            expression=self.source,
        )


def _unknown_name(
    role: str, src: str, name: str, pos: int, valid: tuple[str, ...] | frozenset[str], what: str
) -> ExpressionError:
    close = difflib.get_close_matches(name, sorted(valid), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ExpressionError(
        f"invalid {role}: unknown {what} {name!r} at offset {pos}{hint} "
        f"(available: {', '.join(sorted(valid))})",
        expression=src,
        position=pos,
    )


def _over_limit(role: str, src: str, exc: CostLimitError) -> ExpressionError:
    return ExpressionError(
        f"invalid {role}: {exc.reason}, at offset {exc.position}; {role}s run for every change, so "
        f"their cost is bounded (docs/formats.md, \"Expression limits\")",
        expression=src,
        position=min(exc.position, len(src)),
    )


@functools.lru_cache(maxsize=8192)
def _compile(src: str, role: str) -> CompiledExpr:
    # Cached: registrations repeat (spec validation, then the matcher; many listeners share a
    # filter) and a CompiledExpr is never mutated after this function returns.
    if not isinstance(src, str) or not src.strip():
        raise ExpressionError(
            f"invalid {role}: the expression is empty", expression=str(src), position=0
        )
    try:
        check_source(src)
    except CostLimitError as exc:
        raise _over_limit(role, src, exc) from None
    try:
        program = cel.compile(src)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # ValueError for parse errors; a Rust panic is a BaseException
        raise _syntax_error(role, src, exc) from exc
    try:
        tokens: list[Token] | None = tokenize(src)
    except LexError:
        tokens = None
    root = None
    try:
        if tokens is not None:
            check_tokens(tokens)  # before parsing: the parser recurses into brackets
            try:
                root = parse(tokens)
            except ParseError:
                root = None
        if root is not None:
            check_tree(root)  # before the recursive analyses below
    except CostLimitError as exc:
        raise _over_limit(role, src, exc) from None
    normalized = normalize(src, tokens)
    if root is None:
        # Our analyser does not know this construct: trust the library's variable list and
        # need everything. Comprehension variables cannot be told apart here, so the unknown
        # variable check is skipped rather than refusing a valid expression. The cost bound
        # is the conservative one (every comprehension nested in every other).
        try:
            cost = estimate_unparsed(src)
        except CostLimitError as exc:
            raise _over_limit(role, src, exc) from None
        lib_vars = frozenset(program.variables())
        used = frozenset(v for v in lib_vars if v in VARIABLES)
        fields: dict[str, frozenset[str] | None] = {v: None for v in ("value", "old") if v in used}
        return CompiledExpr(src, role, program, used, fields, normalized=normalized, cost=cost)

    info, eq = analyse(src, root)
    for name, pos in sorted(info.variables.items(), key=lambda kv: kv[1]):
        if name not in VARIABLES:
            raise _unknown_name(role, src, name, pos, VARIABLES, "variable")
    for name, pos in sorted(info.functions.items(), key=lambda kv: kv[1]):
        if name not in _FUNCTIONS:
            raise _unknown_name(role, src, name, pos, _FUNCTIONS, "function")
    shape = result_shape(root)
    if role == "filter" and shape in ("other", "map"):
        raise ExpressionError(
            f"invalid filter: it must return a bool (true = the change matches), but this returns "
            f"a {'map' if shape == 'map' else 'non-bool value'}; compare it, e.g. "
            f"`value.amount > 500.0`",
            expression=src,
            position=root.start,
        )
    if role == "converter" and shape in ("bool", "other"):
        raise ExpressionError(
            "invalid converter: it must return a map (the projection to send), e.g. "
            '`{"id": key, "amount": value.amount}`',
            expression=src,
            position=root.start,
        )
    _check_map_keys(role, src, root)
    try:
        cost = estimate(root)
    except CostLimitError as exc:
        raise _over_limit(role, src, exc) from None
    fields = {
        var: (None if WHOLE in names else frozenset(names)) for var, names in info.fields.items()
    }
    equality = _equality(eq) if role == "filter" and eq is not None else None
    native = native_filter(root) if role == "filter" else native_converter(root)
    comparisons = filter_terms(root) if role == "filter" and native is not None else None
    return CompiledExpr(src, role, program, frozenset(info.variables), fields, equality, normalized,
                        native, comparisons, cost)  # fmt: skip


def _nodes(root: Node) -> Any:
    """``root`` and every node under it."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


def _check_map_keys(role: str, src: str, root: Node) -> None:
    """Refuse a map literal whose literal keys repeat, or collide once evaluated (``1`` and
    ``true``, ``1`` and ``1u`` are one key at run time) or in the notification's JSON (where
    every key is a string: ``1`` and ``"1"``): CEL refuses repeated keys, and one entry
    would silently be lost."""
    for node in _nodes(root):
        if not isinstance(node, MapLit) or node.message is not None:
            continue
        seen: dict[Any, str] = {}
        for key, _value in node.entries:
            if not isinstance(key, Lit) and not (isinstance(key, Unary) and key.op == "-"
                                                 and isinstance(key.operand, Lit)):
                continue  # computed at run time: not known here
            try:
                v = cel.evaluate(src[key.start:key.end])
            except Exception:  # noqa: BLE001 - a literal the library reads otherwise: not checked
                continue
            if not isinstance(v, (str, int)):  # a key of another type: refused by its type check
                continue
            text = src[key.start:key.end]
            as_json = v if isinstance(v, str) else json.dumps(v)
            for ident in ((type(v) is not str, v), ("json", as_json)):
                if ident in seen:
                    raise ExpressionError(
                        f"invalid {role}: map key {text} repeats key {seen[ident]} (one entry would be lost; "
                        "notification keys are JSON strings): give each entry its own key",
                        expression=src, position=key.start)
                seen[ident] = text


def _equality(eq: EqualityConjunct) -> Equality | None:
    try:
        literal = cel.evaluate(eq.literal)
        rest = _compile(eq.rest, "filter") if eq.rest is not None else None
    except Exception:  # an unusual literal or remainder: just do not index this filter
        return None
    return Equality(eq.path, literal, rest)


def compile_filter(src: str) -> CompiledExpr:
    """Compile a listener filter (must yield a bool); raise :class:`ExpressionError` if invalid."""
    return _compile(src, "filter")


def compile_converter(src: str) -> CompiledExpr:
    """Compile a listener converter (must yield a map); raise :class:`ExpressionError` if invalid."""
    return _compile(src, "converter")
