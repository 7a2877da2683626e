"""Static facts about a CEL expression: variables, fields of ``value``/``old``, equality conjuncts.

The worker builds one evaluation context per change holding only the fields some registered
expression reads, and the matcher indexes ``value.<path> == <literal>`` conjuncts. Both rely
on :func:`analyse`. When in doubt the answer is conservative: ``WHOLE`` (send the whole map)
and no equality conjunct.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

__all__ = [
    "ENTITY_VARS",
    "MACROS",
    "WHOLE",
    "Analysis",
    "EqualityConjunct",
    "analyse",
    "conjuncts",
    "result_shape",
]

#: Variables whose content is an entity map (field usage is tracked for these).
ENTITY_VARS = ("value", "old")
#: Comprehension macros: the first argument is a variable bound in the others.
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
#: Marker in :attr:`Analysis.fields`: the whole map is needed.
WHOLE = "*"


@dataclass(frozen=True, slots=True)
class EqualityConjunct:
    """``value.<path> == <literal>`` found as a top-level ``&&`` operand.

    ``literal`` is the literal's CEL source (decode it with the CEL library), ``rest`` the
    source of the remaining conjuncts (``None`` when the equality is the whole filter).
    """

    path: tuple[str, ...]
    literal: str
    rest: str | None


@dataclass(slots=True)
class Analysis:
    """What an expression references."""

    #: Free top-level identifiers, each with the offset of its first use.
    variables: dict[str, int] = field(default_factory=dict)
    #: For ``value`` and ``old``: top-level field names read, or ``{WHOLE}``.
    fields: dict[str, set[str]] = field(default_factory=dict)
    #: Global and receiver function names used, each with the offset of its first use.
    functions: dict[str, int] = field(default_factory=dict)


def _path(node: Node) -> tuple[str, tuple[str, ...]] | None:
    """``value.a.b`` / ``value["a"].b`` as ``("value", ("a", "b"))``; None if not such a path."""
    names: list[str] = []
    while True:
        if isinstance(node, Select):
            names.append(node.name)
            node = node.operand
        elif (
            isinstance(node, Index) and isinstance(node.index, Lit) and node.index.kind == "string"
        ):
            # A string-literal key: the raw text must decode the same as a plain name.
            text = node.index.text
            inner = text[1:-1]
            if len(text) < 2 or text[0] not in "'\"" or "\\" in inner or text[:3] in ('"""', "'''"):
                return None
            names.append(inner)
            node = node.operand
        elif isinstance(node, Ident):
            return node.name, tuple(reversed(names))
        else:
            return None


class _Walker:
    def __init__(self) -> None:
        self.result = Analysis()

    def use_field(self, var: str, name: str) -> None:
        self.result.fields.setdefault(var, set()).add(name)

    def walk(self, node: Node, bound: frozenset[str]) -> None:
        r = self.result
        if isinstance(node, Ident):
            if node.name not in bound:
                r.variables.setdefault(node.name, node.start)
                if node.name in ENTITY_VARS:
                    self.use_field(node.name, WHOLE)
            return
        if isinstance(node, (Select, Index)):
            p = _path(node)
            if p is not None and p[0] not in bound and p[1]:
                r.variables.setdefault(p[0], node.start)
                if p[0] in ENTITY_VARS:
                    self.use_field(p[0], p[1][0])
                return
            if isinstance(node, Select):
                self.walk(node.operand, bound)
            else:
                self.walk(node.operand, bound)
                self.walk(node.index, bound)
            return
        if isinstance(node, Binary):
            # `value == null` / `old != null` only test presence: no field is needed.
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if (
                    node.op in ("==", "!=")
                    and isinstance(a, Ident)
                    and a.name in ENTITY_VARS
                    and a.name not in bound
                    and isinstance(b, Lit)
                    and b.kind == "null"
                ):
                    r.variables.setdefault(a.name, a.start)
                    r.fields.setdefault(a.name, set())
                    return
            self.walk(node.left, bound)
            self.walk(node.right, bound)
            return
        if isinstance(node, Call):
            if node.name != "has":
                r.functions.setdefault(node.name, node.name_start)
            if node.target is not None:
                self.walk(node.target, bound)
            inner = bound
            args = node.args
            if (
                node.name in MACROS
                and node.target is not None
                and args
                and isinstance(args[0], Ident)
            ):
                inner = bound | {args[0].name}
                args = args[1:]
            for a in args:
                self.walk(a, inner)
            return
        if isinstance(node, Unary):
            self.walk(node.operand, bound)
        elif isinstance(node, Cond):
            for n in (node.cond, node.then, node.other):
                self.walk(n, bound)
        elif isinstance(node, ListLit):
            for n in node.items:
                self.walk(n, bound)
        elif isinstance(node, MapLit):
            for k, v in node.entries:
                if node.message is None:
                    self.walk(k, bound)
                self.walk(v, bound)


def conjuncts(node: Node) -> list[Node]:
    """The operands of a top-level chain of ``&&`` (the node itself if it is not one)."""
    if isinstance(node, Binary) and node.op == "&&":
        return conjuncts(node.left) + conjuncts(node.right)
    return [node]


def _scalar_literal(node: Node) -> bool:
    if isinstance(node, Unary) and node.op == "-":
        node = node.operand
        return isinstance(node, Lit) and node.kind in ("int", "double")
    return isinstance(node, Lit) and node.kind in (
        "string",
        "bytes",
        "int",
        "uint",
        "double",
        "bool",
    )


def _equality(src: str, parts: list[Node]) -> EqualityConjunct | None:
    for i, part in enumerate(parts):
        if not (isinstance(part, Binary) and part.op == "=="):
            continue
        for side, other in ((part.left, part.right), (part.right, part.left)):
            p = _path(side)
            if p is None or p[0] != "value" or not p[1] or not _scalar_literal(other):
                continue
            rest = [src[q.start : q.end] for j, q in enumerate(parts) if j != i]
            rest_src = " && ".join(f"({r})" for r in rest) if rest else None
            return EqualityConjunct(p[1], src[other.start : other.end], rest_src)
    return None


def analyse(src: str, root: Node) -> tuple[Analysis, EqualityConjunct | None]:
    """Variables/fields/functions of ``root`` (parsed from ``src``) and its equality conjunct."""
    w = _Walker()
    w.walk(root, frozenset())
    # Top-level conjuncts are outside every comprehension, so `value` there is the variable.
    return w.result, _equality(src, conjuncts(root))


_BOOL_FUNCS = frozenset(
    {"has", "startsWith", "endsWith", "contains", "matches", "all", "exists", "exists_one"}
)
_NON_BOOL_FUNCS = frozenset(
    {
        "size",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "type",
        "duration",
        "timestamp",
        "map",
        "filter",
    }
)


def result_shape(node: Node) -> str:
    """What an expression obviously returns: ``bool``, ``map``, ``other`` or ``unknown``.

    ``other`` means "certainly neither a bool nor a map" (a number, a string, a list...).
    """
    if isinstance(node, Lit):
        return "bool" if node.kind == "bool" else ("unknown" if node.kind == "null" else "other")
    if isinstance(node, Binary):
        if node.op in _RELATION_OPS or node.op in ("&&", "||"):
            return "bool"
        return "other"  # + - * / % never give a bool or a map
    if isinstance(node, Unary):
        return "bool" if node.op == "!" else "other"
    if isinstance(node, ListLit):
        return "other"
    if isinstance(node, MapLit):
        return "map" if node.message is None else "unknown"
    if isinstance(node, Call):
        if node.name in _BOOL_FUNCS:
            return "bool"
        if node.name in _NON_BOOL_FUNCS:
            return "other"
        return "unknown"
    if isinstance(node, Cond):
        a, b = result_shape(node.then), result_shape(node.other)
        return a if a == b else "unknown"
    return "unknown"


_RELATION_OPS = frozenset({"==", "!=", "<", "<=", ">", ">=", "in"})
