"""Static cost bounds for CEL filters and converters, checked at registration.

Expressions run on the worker's poll thread for every change, so an expression whose work
explodes (six nested ``map()`` calls over a 10-element list take seconds and hundreds of MB)
would wedge every worker. This module refuses such expressions before they are registered,
naming the reason and the 0-based position of the offending part:

- the source is at most :attr:`CostLimits.max_length` characters, brackets nest at most
  :attr:`~CostLimits.max_brackets` deep and the syntax tree at most
  :attr:`~CostLimits.max_nesting` deep (which also keeps the analysers' recursion bounded);
- list literals have at most :attr:`~CostLimits.max_list_literal` items, string literals at
  most :attr:`~CostLimits.max_string_literal` characters;
- comprehensions (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) nest at most
  :attr:`~CostLimits.max_comprehension_depth` deep;
- the estimated cost is at most :attr:`~CostLimits.max_cost` steps, and no value it builds
  exceeds :attr:`~CostLimits.max_size` elements or characters.

The estimate (:func:`estimate`) walks the syntax tree once, tracking for every node an upper
bound of its evaluation steps, the size of its value (elements of a list or map, characters
of a string) and the size of each element. Sizes of literals are known; a list, map or string
from the data (``value.items``) is assumed to hold :attr:`~CostLimits.assumed_size` elements.
A comprehension costs its range plus the range's size times its body, so nesting multiplies;
``+`` costs the sizes it copies, so doubling a value in a chain of comprehensions is caught.
One step is about 1 µs of evaluation in the ``cel`` library.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from listeners._lexer import Token
from listeners._parser import (
    Binary,
    Call,
    Cond,
    Ident,
    Index,
    ListLit,
    Lit,
    MapLit,
    Node,
    Select,
    Unary,
)
from listeners.analysis import MACROS

__all__ = ["LIMITS", "CostLimitError", "CostLimits", "check_source", "check_tokens", "check_tree", "children",
           "estimate", "estimate_unparsed"]  # fmt: skip


@dataclass(frozen=True, slots=True)
class CostLimits:
    """The bounds an expression must stay within (docs/formats.md, "Expression limits")."""

    max_length: int = 8192
    max_brackets: int = 24
    max_nesting: int = 64
    max_list_literal: int = 1000
    max_string_literal: int = 4096
    max_comprehension_depth: int = 3
    assumed_size: int = 100
    max_cost: int = 100_000
    max_size: int = 1_000_000


#: The limits registrations are checked against.
LIMITS = CostLimits()
_CAP = 10**30  # sizes and costs are clamped here: enough to compare, never a huge integer


class CostLimitError(ValueError):
    """An expression is over a limit: ``reason`` says which, ``position`` where (0-based)."""

    def __init__(self, reason: str, position: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.position = position


def _n(n: int) -> str:
    """A count for messages: thousands separators, or a power of ten once it is huge."""
    return f"{n:,}" if n < 10**15 else f"about 10^{len(str(n)) - 1}"


def check_source(src: str, limits: CostLimits = LIMITS) -> None:
    """Refuse a source longer than ``limits.max_length`` (before anything parses it)."""
    if len(src) > limits.max_length:
        raise CostLimitError(
            f"the expression is {len(src):,} characters long (limit {limits.max_length:,})", limits.max_length
        )


def check_tokens(tokens: list[Token], limits: CostLimits = LIMITS) -> None:
    """Refuse brackets nested deeper than ``limits.max_brackets`` (the parser recurses on them)."""
    depth = 0
    for t in tokens:
        if t.kind != "op":
            continue
        if t.text in "([{":
            depth += 1
            if depth > limits.max_brackets:
                raise CostLimitError(
                    f"brackets nested more than {limits.max_brackets} deep (limit {limits.max_brackets})", t.start
                )
        elif t.text in ")]}":
            depth -= 1


def children(node: Node) -> list[Node]:
    """The nodes right under ``node``."""
    if isinstance(node, (Select, Unary)):
        return [node.operand]
    if isinstance(node, Index):
        return [node.operand, node.index]
    if isinstance(node, Binary):
        return [node.left, node.right]
    if isinstance(node, Cond):
        return [node.cond, node.then, node.other]
    if isinstance(node, ListLit):
        return list(node.items)
    if isinstance(node, MapLit):
        return [n for kv in node.entries for n in kv]
    if isinstance(node, Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    return []


def check_tree(root: Node, limits: CostLimits = LIMITS) -> None:
    """Refuse a syntax tree deeper than ``limits.max_nesting`` (walked without recursion,
    before any recursive analysis runs)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_nesting:
            raise CostLimitError(
                f"operators nested more than {limits.max_nesting} deep (limit {limits.max_nesting}); "
                f"split a long chain of && / || / + or use `in [...]`", node.start
            )
        stack.extend((child, depth + 1) for child in children(node))


@dataclass(frozen=True, slots=True)
class _Est:
    cost: int  # evaluation steps
    size: int  # elements of a list/map, characters of a string; 1 for a scalar
    elem: int  # size of each element of a list/map


def _clamp(n: int) -> int:
    return n if n < _CAP else _CAP


def _scan(size: int) -> int:
    """Steps to scan a string or compare values of ``size`` (64 characters per step)."""
    return 1 + size // 64


class _Estimator:
    def __init__(self, limits: CostLimits) -> None:
        self.limits = limits
        self.unknown = _Est(1, limits.assumed_size, limits.assumed_size)

    def check(self, node: Node, est: _Est, at: int | None = None) -> _Est:
        lim = self.limits
        pos = node.start if at is None else at
        if est.cost > lim.max_cost:
            raise CostLimitError(f"estimated cost {_n(est.cost)} steps over the limit {_n(lim.max_cost)}", pos)
        if est.size * max(est.elem, 1) > lim.max_size:
            raise CostLimitError(
                f"may build a value of {_n(est.size * max(est.elem, 1))} elements or characters "
                f"(limit {_n(lim.max_size)})", pos
            )
        return est

    def run(self, node: Node, scope: dict[str, _Est], depth: int) -> _Est:
        est = self._node(node, scope, depth)
        return self.check(node, _Est(_clamp(est.cost), _clamp(est.size), _clamp(est.elem)))

    def _node(self, node: Node, scope: dict[str, _Est], depth: int) -> _Est:
        lim = self.limits
        if isinstance(node, Lit):
            if node.kind in ("string", "bytes"):
                chars = len(node.text)
                if chars > lim.max_string_literal + 8:  # quotes and prefixes aside
                    raise CostLimitError(
                        f"a string literal of {chars:,} characters (limit {lim.max_string_literal:,})", node.start
                    )
                return _Est(1, chars, 1)
            return _Est(1, 1, 1)
        if isinstance(node, Ident):
            return scope.get(node.name, self.unknown)
        if isinstance(node, Select):
            o = self.run(node.operand, scope, depth)
            return _Est(o.cost + 1, lim.assumed_size, lim.assumed_size)
        if isinstance(node, Index):
            o, i = self.run(node.operand, scope, depth), self.run(node.index, scope, depth)
            return _Est(o.cost + i.cost + 1, o.elem, lim.assumed_size)
        if isinstance(node, Unary):
            o = self.run(node.operand, scope, depth)
            return _Est(o.cost + 1, 1, 1)
        if isinstance(node, Binary):
            return self._binary(node, scope, depth)
        if isinstance(node, Cond):
            c, t, o = (self.run(n, scope, depth) for n in (node.cond, node.then, node.other))
            return _Est(c.cost + max(t.cost, o.cost) + 1, max(t.size, o.size), max(t.elem, o.elem))
        if isinstance(node, ListLit):
            if len(node.items) > lim.max_list_literal:
                raise CostLimitError(
                    f"a list literal of {len(node.items):,} items (limit {lim.max_list_literal:,})", node.start
                )
            items = [self.run(n, scope, depth) for n in node.items]
            return _Est(sum(e.cost for e in items) + len(items) + 1, len(items), max((e.size for e in items), default=1))
        if isinstance(node, MapLit):
            if len(node.entries) > lim.max_list_literal:
                raise CostLimitError(
                    f"a map literal of {len(node.entries):,} entries (limit {lim.max_list_literal:,})", node.start
                )
            parts = [(self.run(k, scope, depth), self.run(v, scope, depth)) for k, v in node.entries]
            cost = sum(k.cost + v.cost for k, v in parts) + len(parts) + 1
            return _Est(cost, len(parts), max((v.size for _, v in parts), default=1))
        if isinstance(node, Call):
            return self._call(node, scope, depth)
        return _Est(1, lim.assumed_size, lim.assumed_size)  # pragma: no cover - every node kind is above

    def _binary(self, node: Binary, scope: dict[str, _Est], depth: int) -> _Est:
        a, b = self.run(node.left, scope, depth), self.run(node.right, scope, depth)
        base = a.cost + b.cost
        if node.op == "+":  # concatenation copies both sides
            return _Est(base + _scan(a.size + b.size), a.size + b.size, max(a.elem, b.elem))
        if node.op == "in":
            return _Est(base + b.size, 1, 1)
        if node.op in ("==", "!=", "<", "<=", ">", ">="):
            return _Est(base + _scan(min(a.size, b.size)), 1, 1)
        return _Est(base + 1, 1, 1)

    def _call(self, node: Call, scope: dict[str, _Est], depth: int) -> _Est:
        lim = self.limits
        args = node.args
        if node.name in MACROS and node.target is not None and args and isinstance(args[0], Ident):
            if depth + 1 > lim.max_comprehension_depth:
                raise CostLimitError(
                    f"comprehensions nested {depth + 1} deep (limit {lim.max_comprehension_depth})",
                    node.name_start,
                )
            rng = self.run(node.target, scope, depth)
            inner = {**scope, args[0].name: _Est(1, rng.elem, lim.assumed_size)}
            bodies = [self.run(a, inner, depth + 1) for a in args[1:]]
            per_item = sum(b.cost for b in bodies) + 1
            est = _Est(rng.cost + rng.size * per_item + 1, 1, 1)
            if node.name == "map":
                est = _Est(est.cost, rng.size, bodies[-1].size if bodies else 1)
            elif node.name == "filter":
                est = _Est(est.cost, rng.size, rng.elem)
            return self.check(node, est, node.name_start)
        target = self.run(node.target, scope, depth) if node.target is not None else None
        parts = [self.run(a, scope, depth) for a in args]
        cost = sum(p.cost for p in parts) + (target.cost if target else 0) + 1
        if node.name in ("contains", "startsWith", "endsWith", "matches") and target is not None:
            pattern = sum(p.size for p in parts)
            return _Est(cost + _scan(target.size) + (pattern if node.name == "matches" else 0), 1, 1)
        if node.name in ("string", "bytes", "dyn") and parts:
            return _Est(cost + _scan(parts[0].size), parts[0].size, parts[0].elem)
        if node.name == "size" or node.name == "has" or node.name.startswith("get"):
            return _Est(cost, 1, 1)
        return _Est(cost + sum(_scan(p.size) for p in parts), 1, 1)


def estimate(root: Node, limits: CostLimits = LIMITS) -> int:
    """Upper bound of the evaluation steps of ``root``; :class:`CostLimitError` if it is over
    any limit. Call :func:`check_tree` first (this walk recurses)."""
    return _Estimator(limits).run(root, {}, 0).cost


_MACRO_CALL = re.compile(r"\.\s*(?:all|exists_one|exists|map|filter)\s*\(")


def estimate_unparsed(src: str, limits: CostLimits = LIMITS) -> int:
    """A conservative bound for an expression the analyser cannot parse: every comprehension
    is assumed nested in every other, over lists of the assumed size."""
    macros = list(_MACRO_CALL.finditer(src))
    if len(macros) > limits.max_comprehension_depth:
        raise CostLimitError(
            f"{len(macros)} comprehensions that may be nested (limit {limits.max_comprehension_depth} deep; "
            f"this expression could not be analysed in detail)", macros[limits.max_comprehension_depth].start()
        )
    cost = _clamp(max(len(src), 1) * limits.assumed_size ** len(macros))
    if cost > limits.max_cost:
        raise CostLimitError(
            f"estimated cost {_n(cost)} steps over the limit {_n(limits.max_cost)} (this expression "
            f"could not be analysed in detail, so its comprehensions count as nested)", macros[0].start()
        )
    return cost
