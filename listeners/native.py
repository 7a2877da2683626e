"""Native fast paths for the commonest listener expressions (no CEL context, no CEL call).

Building a CEL context (converting the entity map into CEL values) costs more than evaluating
the expression, so two very common shapes are compiled to plain Python closures:

- filters that are ``true`` or a ``&&`` chain of comparisons ``<operand> OP <literal>`` (or
  ``<literal> OP <operand>``), where the operand is ``key`` or a field path ``value.a.b`` and
  OP is one of ``== != < <= > >=``; literals are ints, doubles, strings and bools;
- converters that are a map literal with distinct string keys whose values are ``key``, a
  field path ``value.a.b`` or such a literal.

A closure takes ``(key, value)`` and returns the result, or :data:`FALLBACK` whenever the data
is not the plain case it was built for: a missing field, a value of another type than the
literal (CEL does not mix int and double in ordering, and reports errors), a NaN, a nested value
in a converter. The caller then evaluates the expression with CEL, so results (and errors) are
always CEL's; ``tests/unit/test_listener_native.py`` checks this on random inputs.

Evaluation order: conjuncts run left to right; a closure decides ``false`` only after every
conjunct before the false one ran in the plain case (so CEL would also see no error there),
and ``true`` only when all did.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

import cel

from listeners._parser import Binary, Ident, Index, Lit, MapLit, Node, Select, Unary

__all__ = ["FALLBACK", "NativeFn", "native_converter", "native_filter"]

#: Returned by a native closure when CEL must decide.
FALLBACK: Any = object()

#: ``fn(key, value)`` -> result or :data:`FALLBACK`.
NativeFn = Callable[[str, Mapping[str, Any] | None], Any]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge,
}  # fmt: skip
_MIRROR = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_LITERAL_KINDS = frozenset({"int", "double", "string", "bool"})
_SCALARS = frozenset({str, int, float, bool, type(None)})
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MISSING: Any = object()

#: An operand: ``None`` for ``key``, else the field path under ``value``.
_Operand = tuple[str, ...] | None


def _literal(node: Node) -> tuple[bool, Any]:
    """``(True, python value)`` for an int/double/string/bool literal (or a negated number)."""
    lit = node.operand if isinstance(node, Unary) and node.op == "-" else node
    if not isinstance(lit, Lit) or lit.kind not in _LITERAL_KINDS:
        return False, None
    if lit is not node and lit.kind not in ("int", "double"):
        return False, None
    text = lit.text if lit is node else "-" + lit.text
    if lit.kind == "bool":
        return True, text == "true"
    if lit.kind == "string" and text[:1] in ("r", "R"):
        return False, None  # raw strings: rare, leave them to CEL
    try:
        value: Any = cel.evaluate(text)
    except Exception:  # an unusual literal: not for the fast path
        return False, None
    expected: type = {"int": int, "double": float, "string": str}[lit.kind]
    if type(value) is not expected or not _plain(value):
        return False, None
    return True, value


def _operand(node: Node) -> tuple[bool, _Operand]:
    """``key`` -> ``(True, None)``; ``value.a.b`` -> ``(True, ("a", "b"))``."""
    if isinstance(node, Ident):
        return (True, None) if node.name == "key" else (False, None)
    names: list[str] = []
    while isinstance(node, Select):
        names.append(node.name)
        node = node.operand
    if isinstance(node, Index) or not isinstance(node, Ident) or node.name != "value" or not names:
        return False, None
    return True, tuple(reversed(names))


def _getter(path: _Operand) -> Callable[[str, Any], Any]:
    if path is None:
        return lambda key, _value: key
    if len(path) == 1:
        (name,) = path

        def get1(_key: str, value: Any) -> Any:
            if type(value) is not dict:
                return _MISSING
            return value.get(name, _MISSING)

        return get1

    def get(_key: str, value: Any) -> Any:
        cur = value
        for p in path:
            if type(cur) is not dict:
                return _MISSING
            cur = cur.get(p, _MISSING)
            if cur is _MISSING:
                return _MISSING
        return cur

    return get


def _plain(v: Any) -> bool:
    """False for the values CEL treats specially: NaN (no ordering) and ints beyond int64."""
    t = type(v)
    if t is float:
        return not math.isnan(v)
    if t is int:
        return _INT64[0] <= v <= _INT64[1]
    return True


def _conjuncts(node: Node) -> list[Node]:
    if isinstance(node, Binary) and node.op == "&&":
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


def native_filter(root: Node) -> NativeFn | None:
    """A closure for a filter of the supported shape, else None."""
    if isinstance(root, Lit) and root.kind == "bool":
        constant = root.text == "true"
        return lambda _key, _value: constant
    terms: list[tuple[Callable[[str, Any], Any], Callable[[Any, Any], bool], Any, type]] = []
    for part in _conjuncts(root):
        if not isinstance(part, Binary) or part.op not in _OPS:
            return None
        op = part.op
        ok, path = _operand(part.left)
        lit_ok, lit = _literal(part.right)
        if not (ok and lit_ok):
            ok, path = _operand(part.right)
            lit_ok, lit = _literal(part.left)
            op = _MIRROR[op]
        if not (ok and lit_ok):
            return None
        if path is None and type(lit) is not str:
            return None  # `key` is a string
        terms.append((_getter(path), _OPS[op], lit, type(lit)))

    if len(terms) == 1:
        ((get, fn, lit, typ),) = terms

        def one(key: str, value: Any) -> Any:
            v = get(key, value)
            if type(v) is not typ or not _plain(v):
                return FALLBACK
            return fn(v, lit)

        return one

    def conj(key: str, value: Any) -> Any:
        for get, fn, lit, typ in terms:
            v = get(key, value)
            if type(v) is not typ or not _plain(v):
                return FALLBACK
            if not fn(v, lit):
                return False
        return True

    return conj


def native_converter(root: Node) -> NativeFn | None:
    """A closure for a converter of the supported shape (see the module docstring), else None."""
    if not isinstance(root, MapLit) or root.message is not None:
        return None
    items: list[tuple[str, Callable[[str, Any], Any] | None, Any]] = []
    seen: set[str] = set()
    for k, v in root.entries:
        ok, name = _literal(k)
        if not ok or type(name) is not str or name in seen:
            return None
        seen.add(name)
        ok, path = _operand(v)
        if ok:
            items.append((name, _getter(path), None))
            continue
        ok, lit = _literal(v)
        if not ok:
            return None
        items.append((name, None, lit))

    def convert(key: str, value: Any) -> Any:
        out: dict[str, Any] = {}
        for name, get, lit in items:
            if get is None:
                out[name] = lit
                continue
            v = get(key, value)
            if type(v) not in _SCALARS or not _plain(v):
                return FALLBACK
            out[name] = v
        return out

    return convert
