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

__all__ = [
    "FALLBACK",
    "Comparison",
    "NativeFn",
    "SharedComparisons",
    "filter_terms",
    "native_converter",
    "native_filter",
    "shape_of",
]

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
        return bool(_INT64[0] <= v <= _INT64[1])
    return True


def _conjuncts(node: Node) -> list[Node]:
    if isinstance(node, Binary) and node.op == "&&":
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


#: One comparison of a native filter: operand (None = ``key``, else a path under ``value``),
#: operator, literal.
Comparison = tuple[_Operand, str, Any]


def filter_terms(root: Node) -> tuple[Comparison, ...] | None:
    """The comparisons of a filter ``c1 && c2 && ...`` of the supported shape, else None
    (also for the constants ``true``/``false``)."""
    terms: list[Comparison] = []
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
        terms.append((path, op, lit))
    return tuple(terms)


def native_filter(root: Node) -> NativeFn | None:
    """A closure for a filter of the supported shape, else None."""
    if isinstance(root, Lit) and root.kind == "bool":
        constant = root.text == "true"
        return lambda _key, _value: constant
    comparisons = filter_terms(root)
    if comparisons is None:
        return None
    terms: list[_Term] = []
    for path, op, lit in comparisons:
        name = path[0] if path is not None and len(path) == 1 else None
        typ = type(lit)
        check = _CHECK_FLOAT if typ is float else _CHECK_INT if typ is int else 0
        terms.append((name, _getter(path), _OPS[op], lit, typ, check))
    return _conjunction(tuple(terms))


def shape_of(terms: tuple[Comparison, ...]) -> tuple[Any, ...]:
    """What filters must share to be evaluated together (:class:`SharedComparisons`): the
    operands, operators and literal types, in order. Only the literals differ."""
    return tuple((path, op, type(lit)) for path, op, lit in terms)


class SharedComparisons:
    """Filters of one :func:`shape_of`, evaluated together on a state: each operand is read
    and checked once, then every filter costs its comparisons only (no call per filter).

    Exactly the native closures' verdicts: a filter is ``unsure`` (CEL must decide) where
    its closure would return :data:`FALLBACK`, else a hit or not.
    """

    __slots__ = ("_checks", "_fns", "_getters", "_members", "_typs", "shape")

    def __init__(self, shape: tuple[Any, ...]) -> None:
        self.shape = shape
        self._getters = tuple(_getter(path) for path, _op, _typ in shape)
        self._fns = tuple(_OPS[op] for _path, op, _typ in shape)
        self._typs = tuple(typ for _path, _op, typ in shape)
        self._checks = tuple(_CHECK_FLOAT if t is float else _CHECK_INT if t is int else 0
                             for t in self._typs)  # fmt: skip
        self._members: list[tuple[Any, ...]] = []  # (member, literal, literal, ...)

    def add(self, member: Any, terms: tuple[Comparison, ...]) -> None:
        """Add a filter (``member`` is what :meth:`run` reports) with these comparisons."""
        assert shape_of(terms) == self.shape
        self._members.append((member, *(lit for _path, _op, lit in terms)))

    def __len__(self) -> int:
        return len(self._members)

    def run(self, key: str, value: Any, hits: list[Any], unsure: list[Any]) -> int:
        """Append the members that match ``(key, value)`` to ``hits`` and those CEL must
        decide to ``unsure``; return how many were decided here."""
        values: list[Any] = []
        for get, typ, check in zip(self._getters, self._typs, self._checks, strict=True):
            v = get(key, value)
            if type(v) is not typ:
                v = _MISSING
            elif check:
                if check == _CHECK_FLOAT:
                    if v != v:  # NaN
                        v = _MISSING
                elif not _LO <= v <= _HI:
                    v = _MISSING
            values.append(v)
        members = self._members
        v1 = values[0]
        if v1 is _MISSING:  # the first comparison is reached by every filter
            unsure.extend(m[0] for m in members)
            return 0
        fn1 = self._fns[0]
        if len(values) == 1:
            for member, lit in members:
                if fn1(v1, lit):
                    hits.append(member)
            return len(members)
        if len(values) == 2:
            v2, fn2 = values[1], self._fns[1]
            undecided = 0
            for member, lit1, lit2 in members:
                if fn1(v1, lit1):
                    if v2 is _MISSING:
                        unsure.append(member)
                        undecided += 1
                    elif fn2(v2, lit2):
                        hits.append(member)
            return len(members) - undecided
        fns = self._fns
        undecided = 0
        for m in members:
            for i, v in enumerate(values):
                if v is _MISSING:
                    unsure.append(m[0])
                    undecided += 1
                    break
                if not fns[i](v, m[i + 1]):
                    break
            else:
                hits.append(m[0])
        return len(members) - undecided


_CHECK_FLOAT, _CHECK_INT = 1, 2
_LO, _HI = _INT64
#: (field name if the operand is ``value.<name>``, else None; the operand's getter;
#: comparison; literal; the literal's type; which plain-value check the operand needs)
_Term = tuple[str | None, Callable[[str, Any], Any], Callable[[Any, Any], bool], Any, Any, int]


def _conjunction(terms: tuple[_Term, ...]) -> NativeFn:
    """The closure for ``term && term && ...``: one Python call per filter, operands of the
    form ``value.<name>`` read inline (this runs for every filter on every change)."""
    if len(terms) == 1 and terms[0][0] is not None:
        ((name, _get, fn, lit, typ, check),) = terms

        def one(_key: str, value: Any) -> Any:
            if type(value) is not dict:
                return FALLBACK
            v = value.get(name, _MISSING)
            if type(v) is not typ:
                return FALLBACK
            if check:
                if check == _CHECK_FLOAT:
                    if v != v:  # NaN
                        return FALLBACK
                elif not _LO <= v <= _HI:
                    return FALLBACK
            return fn(v, lit)

        return one

    if len(terms) == 2 and terms[0][0] is not None and terms[1][0] is not None:
        (name1, _g1, fn1, lit1, typ1, check1), (name2, _g2, fn2, lit2, typ2, check2) = terms

        def two(_key: str, value: Any) -> Any:
            if type(value) is not dict:
                return FALLBACK
            v = value.get(name1, _MISSING)
            if type(v) is not typ1:
                return FALLBACK
            if check1:
                if check1 == _CHECK_FLOAT:
                    if v != v:
                        return FALLBACK
                elif not _LO <= v <= _HI:
                    return FALLBACK
            if not fn1(v, lit1):
                return False
            v = value.get(name2, _MISSING)
            if type(v) is not typ2:
                return FALLBACK
            if check2:
                if check2 == _CHECK_FLOAT:
                    if v != v:
                        return FALLBACK
                elif not _LO <= v <= _HI:
                    return FALLBACK
            return fn2(v, lit2)

        return two

    def conj(key: str, value: Any) -> Any:
        plain_map = type(value) is dict
        for name, get, fn, lit, typ, check in terms:
            if name is None:
                v = get(key, value)
            elif plain_map:
                v = value.get(name, _MISSING)
            else:
                return FALLBACK  # a field of a non-map (or null) value: CEL decides
            if type(v) is not typ:
                return FALLBACK
            if check:
                if check == _CHECK_FLOAT:
                    if v != v:  # NaN
                        return FALLBACK
                elif not _LO <= v <= _HI:
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
