"""Static checks of a listener expression against its entity type (registration only).

:func:`check` infers the static type (:mod:`listeners.static_types`) of every part of a
parsed filter or converter and raises :class:`StaticError` (with the 0-based position of the
offending part) for what can never evaluate without an error, whatever the record:

- a field the record type does not have (``value.x``, ``old.x``, nested records, ``meta.x``);
  a field tested with ``has()`` anywhere in the expression is not refused (it may be absent);
- an operator whose operand types never fit it: ``value.amount > "abc"`` (CEL does not
  convert between types), ``value.seats + 1.0``, ``!value.amount``, ``"a" in "abc"``;
  and ``==``/``!=`` between types that are never equal (a double and a string: always false);
- a division or remainder by a literal zero (``1 / 0``);
- a map literal key of a type CEL refuses as a key (keys are int, uint, bool or string);
- a filter whose type is not bool, a converter whose type is not a map.

Anything whose type is not certain is ``dyn`` and accepted: the checks never refuse an
expression that could evaluate for some record.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Mapping

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
from listeners.static_types import BOOL, DYN, INT, NULL, STRING, T

__all__ = ["StaticError", "check", "infer"]

_NUMBERS = frozenset({"int", "uint", "double"})
_ORDERED = frozenset({"string", "bytes", "bool", "timestamp", "duration"})
_KEY_KINDS = frozenset({"int", "uint", "bool", "string"})
_LITERALS = {"int": INT, "uint": T("uint"), "double": T("double"), "string": STRING, "bytes": T("bytes"),
             "bool": BOOL, "null": NULL}  # fmt: skip
_ARITH: dict[str, dict[tuple[str, str], str]] = {
    "+": {("int", "int"): "int", ("uint", "uint"): "uint", ("double", "double"): "double",
          ("string", "string"): "string", ("bytes", "bytes"): "bytes", ("list", "list"): "list",
          ("timestamp", "duration"): "timestamp", ("duration", "timestamp"): "timestamp",
          ("duration", "duration"): "duration"},
    "-": {("int", "int"): "int", ("uint", "uint"): "uint", ("double", "double"): "double",
          ("timestamp", "timestamp"): "duration", ("timestamp", "duration"): "timestamp",
          ("duration", "duration"): "duration"},
    "*": {("int", "int"): "int", ("uint", "uint"): "uint", ("double", "double"): "double"},
    "/": {("int", "int"): "int", ("uint", "uint"): "uint", ("double", "double"): "double"},
    "%": {("int", "int"): "int", ("uint", "uint"): "uint"},
}  # fmt: skip
_RESULTS = {"size": INT, "int": INT, "uint": T("uint"), "double": T("double"), "string": STRING,
            "bytes": T("bytes"), "duration": T("duration"), "timestamp": T("timestamp"),
            "contains": BOOL, "startsWith": BOOL, "endsWith": BOOL, "matches": BOOL,
            "all": BOOL, "exists": BOOL, "exists_one": BOOL}  # fmt: skip


def _join(a: T, b: T) -> T:
    """The type of a value that is either ``a`` or ``b`` (list items, map values, a ternary's
    branches, list concatenation): dyn where the two do not agree, so nothing is refused
    about a value that may be of either type."""
    if a == b:
        return a
    if a.kind != b.kind or a.kind in ("record", "dyn"):
        return DYN
    if a.kind in ("list", "map"):
        key = _join(a.key or DYN, b.key or DYN) if a.kind == "map" else None
        return T(a.kind, elem=_join(a.elem or DYN, b.elem or DYN), key=key)
    return T(a.kind, nullable=a.nullable or b.nullable)


def _joined(types: list[T]) -> T:
    return functools.reduce(_join, types) if types else DYN


def _a(t: T) -> str:
    """``a double``, ``an int``."""
    d = t.describe()
    return f"an {d}" if d[0] in "aeiou" else f"a {d}"


class StaticError(ValueError):
    """A part of an expression that can never evaluate; ``position``: its 0-based offset."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


def _zero(node: Node) -> bool:
    """True for an int or uint literal 0 (also negated)."""
    if isinstance(node, Unary) and node.op == "-":
        node = node.operand
    if not isinstance(node, Lit) or node.kind not in ("int", "uint"):
        return False
    try:
        return int(node.text.rstrip("uU"), 0) == 0
    except ValueError:
        return False


def _string_key(node: Node) -> str | None:
    """The text of a simple string literal (no escapes, no raw or triple quotes), else None."""
    if not isinstance(node, Lit) or node.kind != "string":
        return None
    text = node.text
    if len(text) < 2 or text[0] not in "'\"" or "\\" in text or text[:3] in ('"""', "'''"):
        return None
    return text[1:-1]


def _path(node: Node) -> tuple[str, ...] | None:
    """``value.a.b`` as ``("value", "a", "b")``; None if the node is not such a path."""
    names: list[str] = []
    while True:
        if isinstance(node, Select):
            names.append(node.name)
            node = node.operand
        elif isinstance(node, Index) and (k := _string_key(node.index)) is not None:
            names.append(k)
            node = node.operand
        elif isinstance(node, Ident):
            return (node.name, *reversed(names))
        else:
            return None


def _guarded(root: Node) -> set[tuple[str, ...]]:
    """Paths tested with ``has()``, and their prefixes: not refused as unknown fields."""
    out: set[tuple[str, ...]] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Call) and node.name == "has" and node.target is None and len(node.args) == 1:
            p = _path(node.args[0])
            if p is not None:
                out.update(p[:i] for i in range(2, len(p) + 1))
        for value in vars(node).values():
            if isinstance(value, Node):
                stack.append(value)
            elif isinstance(value, list):
                for item in value:
                    stack.extend(x for x in (item if isinstance(item, tuple) else (item,)) if isinstance(x, Node))
    return out


class _Checker:
    def __init__(self, src: str, env: Mapping[str, T], guarded: set[tuple[str, ...]]) -> None:
        self.src = src
        self.env = env
        self.guarded = guarded

    def text(self, node: Node) -> str:
        t = self.src[node.start : node.end]
        return t if len(t) <= 40 else t[:37] + "..."

    def fail(self, message: str, node: Node) -> StaticError:
        return StaticError(message, node.start)

    def walk(self, node: Node, scope: Mapping[str, T]) -> T:
        if isinstance(node, Lit):
            return _LITERALS.get(node.kind, DYN)
        if isinstance(node, Ident):
            return scope.get(node.name) or self.env.get(node.name, DYN)
        if isinstance(node, Select):
            return self.field(node, node.operand, node.name, scope, node.end - len(node.name))
        if isinstance(node, Index):
            key = _string_key(node.index)
            if key is not None:
                return self.field(node, node.operand, key, scope, node.index.start)
            ot, it = self.walk(node.operand, scope), self.walk(node.index, scope)
            if ot.kind in ("list", "map") and ot.elem is not None:
                return ot.elem
            if ot.known and ot.kind not in ("record", "null") and it.known:
                raise self.fail(f"{self.text(node.operand)} is {_a(ot)}: it cannot be indexed", node)
            return DYN
        if isinstance(node, Call):
            return self.call(node, scope)
        if isinstance(node, Unary):
            t = self.walk(node.operand, scope)
            if node.op == "!":
                self.want_bool(t, node.operand, "'!'")
                return BOOL
            if t.known and t.kind not in _NUMBERS - {"uint"} and t.kind != "duration":
                raise self.fail(f"'-' cannot negate {self.text(node.operand)}, {_a(t)}", node)
            return T(t.kind)
        if isinstance(node, Binary):
            return self.binary(node, scope)
        if isinstance(node, Cond):
            self.want_bool(self.walk(node.cond, scope), node.cond, "a condition '?'")
            return _join(self.walk(node.then, scope), self.walk(node.other, scope))
        if isinstance(node, ListLit):
            return T("list", elem=_joined([self.walk(n, scope) for n in node.items]))
        if isinstance(node, MapLit):
            keys, values = [], []
            for k, v in node.entries:
                if node.message is None:
                    kt = self.walk(k, scope)
                    if kt.known and kt.kind not in _KEY_KINDS:
                        raise self.fail(f"map keys must be int, uint, bool or string; the key {self.text(k)} "
                                        f"is {_a(kt)}", k)  # fmt: skip
                    keys.append(kt)
                values.append(self.walk(v, scope))
            if node.message is not None:
                return DYN
            return T("map", elem=_joined(values), key=_joined(keys))
        return DYN

    def field(self, node: Node, operand: Node, name: str, scope: Mapping[str, T], at: int) -> T:
        ot = self.walk(operand, scope)
        if ot.kind == "map":
            return ot.elem or DYN
        if ot.kind == "record" and ot.fields is not None:
            ft = ot.fields.get(name)
            if ft is not None:
                return ft
            path = _path(node)
            if path is not None and path in self.guarded:
                return DYN
            close = difflib.get_close_matches(name, sorted(ot.fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            what = "meta has" if ot.name == "meta" else f"{ot.name or self.text(operand)} records have"
            raise StaticError(f"unknown field {name!r}: {what} no such field{hint} "
                              f"(fields: {', '.join(sorted(ot.fields))})", at)  # fmt: skip
        if ot.known and ot.kind != "null":
            raise self.fail(f"{self.text(operand)} is {_a(ot)}: it has no field {name!r}", node)
        return DYN

    def call(self, node: Call, scope: Mapping[str, T]) -> T:
        args = node.args
        if node.name == "has" and node.target is None:
            if len(args) == 1 and isinstance(args[0], Select):
                self.walk(args[0].operand, scope)
            return BOOL
        if node.name in MACROS and node.target is not None and args and isinstance(args[0], Ident):
            rt = self.walk(node.target, scope)
            var = {"list": rt.elem or DYN, "map": rt.key or DYN, "record": STRING}.get(rt.kind, DYN)
            inner = {**scope, args[0].name: var}
            body = [self.walk(a, inner) for a in args[1:]]
            if node.name == "map" and body:
                return T("list", elem=body[-1])
            return T("list", elem=var) if node.name == "filter" else BOOL
        if node.target is not None:
            self.walk(node.target, scope)
        for a in args:
            self.walk(a, scope)
        return _RESULTS.get(node.name, DYN)

    def want_bool(self, t: T, node: Node, what: str) -> None:
        if t.known and t.kind != "bool":
            raise self.fail(f"{what} needs a bool, but {self.text(node)} is {_a(t)}", node)

    def binary(self, node: Binary, scope: Mapping[str, T]) -> T:
        op = node.op
        a, b = self.walk(node.left, scope), self.walk(node.right, scope)
        pair = f"{self.text(node.left)} ({_a(a)}) and {self.text(node.right)} ({_a(b)})"
        if op in ("&&", "||"):
            self.want_bool(a, node.left, f"'{op}'")
            self.want_bool(b, node.right, f"'{op}'")
            return BOOL
        both = a.known and b.known
        if op in ("<", "<=", ">", ">="):
            if both and not ({a.kind, b.kind} <= _NUMBERS or (a.kind == b.kind and a.kind in _ORDERED)):
                raise self.fail(f"'{op}' cannot compare {pair}: CEL does not convert between types; "
                                f"compare with a value of the field's type", node)  # fmt: skip
            return BOOL
        if op in ("==", "!="):
            maps = {"map", "record"}
            if both and "null" not in (a.kind, b.kind) and a.kind != b.kind \
                    and not {a.kind, b.kind} <= _NUMBERS and not {a.kind, b.kind} <= maps:  # fmt: skip
                never = "never equal" if op == "==" else "always different"
                raise self.fail(f"'{op}' compares {pair}: values of these types are {never}", node)
            return BOOL
        if op == "in":
            if b.known and b.kind not in ("list", "map", "record"):
                raise self.fail(f"'in' needs a list or a map on its right, but {self.text(node.right)} is "
                                f"{_a(b)}", node.right)  # fmt: skip
            return BOOL
        if op in ("/", "%") and _zero(node.right):
            raise self.fail(f"'{op}' by zero: {self.text(node)} always fails", node.right)
        if not both:
            return DYN
        kind = _ARITH.get(op, {}).get((a.kind, b.kind))
        if kind is None:
            raise self.fail(f"'{op}' is not defined for {pair}; CEL does not convert between types: "
                            f"convert explicitly, e.g. double(x) or int(x)", node)  # fmt: skip
        return T(kind, elem=_join(a.elem or DYN, b.elem or DYN)) if kind == "list" else T(kind)


def infer(src: str, root: Node, env: Mapping[str, T]) -> T:
    """The static type of ``root`` (parsed from ``src``) with variables typed by ``env``;
    :class:`StaticError` for a part that can never evaluate (see the module docstring)."""
    return _Checker(src, env, _guarded(root)).walk(root, {})


def check(src: str, root: Node, role: str, env: Mapping[str, T]) -> None:
    """:func:`infer`, then the result type of a ``filter`` (bool) or ``converter`` (map)."""
    t = infer(src, root, env)
    if not t.known:
        return
    if role == "filter" and t.kind != "bool":
        raise StaticError(f"a filter must return a bool (true = the change matches), but this returns "
                          f"{_a(t)}; compare it, e.g. `value.amount > 500.0`", root.start)  # fmt: skip
    if role == "converter" and t.kind not in ("map", "record"):
        raise StaticError(f"a converter must return a map (the projection to send), but this returns "
                          f"{_a(t)}; e.g. `{{\"id\": key, \"amount\": value.amount}}`", root.start)  # fmt: skip
