"""A recursive-descent parser for CEL into a small AST, for static analysis only.

It follows the CEL grammar (cel-spec ``langdef.md``) closely enough for the expressions
listeners use. It never evaluates anything: evaluation is the ``cel`` library's job. Nodes keep
their source span so an analysis can report positions and cut out sub-expressions (the
"rest" of an indexed conjunction is re-compiled from its source text).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from listeners._lexer import LexError, Token, tokenize

__all__ = [
    "Binary",
    "Call",
    "Cond",
    "Ident",
    "Index",
    "ListLit",
    "Lit",
    "MapLit",
    "Node",
    "ParseError",
    "Select",
    "Unary",
    "parse",
]

_RELATIONS = {"==", "!=", "<", "<=", ">", ">=", "in"}


class ParseError(ValueError):
    """The analyser could not parse the text (the caller falls back to conservative answers)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


@dataclass(eq=False)
class Node:
    """Base of AST nodes; ``start``/``end`` are source offsets."""

    start: int = field(default=0, kw_only=True)
    end: int = field(default=0, kw_only=True)


@dataclass(eq=False)
class Lit(Node):
    """A literal; ``kind`` is the token kind (string, bytes, int, uint, double) or bool/null."""

    kind: str
    text: str


@dataclass(eq=False)
class Ident(Node):
    name: str


@dataclass(eq=False)
class Select(Node):
    operand: Node
    name: str


@dataclass(eq=False)
class Index(Node):
    operand: Node
    index: Node


@dataclass(eq=False)
class Call(Node):
    """A global call (``target`` None) or a receiver-style call ``target.name(args)``."""

    target: Node | None
    name: str
    args: list[Node]
    name_start: int = 0


@dataclass(eq=False)
class Unary(Node):
    op: str
    operand: Node


@dataclass(eq=False)
class Binary(Node):
    op: str
    left: Node
    right: Node


@dataclass(eq=False)
class Cond(Node):
    cond: Node
    then: Node
    other: Node


@dataclass(eq=False)
class ListLit(Node):
    items: list[Node]


@dataclass(eq=False)
class MapLit(Node):
    """A map literal, or a message construction ``Name{field: v}`` (``message`` set)."""

    entries: list[tuple[Node, Node]]
    message: str | None = None


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0

    # -- token helpers --------------------------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def _is(self, text: str) -> bool:
        t = self.tok
        return t.text == text and t.kind in ("op", "ident")

    def _take(self) -> Token:
        t = self.tokens[self.i]
        self.i += 1
        return t

    def _expect(self, text: str) -> Token:
        if not self._is(text):
            raise ParseError(f"expected {text!r}, found {self.tok.text or 'end'!r}", self.tok.start)
        return self._take()

    def _span(self, node: Node, start: int) -> Node:
        node.start = start
        node.end = self.tokens[self.i - 1].end
        return node

    # -- grammar ----------------------------------------------------------------------------
    def parse(self) -> Node:
        node = self.expr()
        if self.tok.kind != "eof":
            raise ParseError(f"unexpected {self.tok.text!r}", self.tok.start)
        return node

    def expr(self) -> Node:
        # `a ? b : c ? d : e` nests to the right; built in a loop, so a long chain of
        # conditionals does not recurse (only brackets do: their depth is checked first).
        arms: list[tuple[int, Node, Node]] = []
        while True:
            start = self.tok.start
            cond = self.binary(0)
            if not self._is("?"):
                break
            self._take()
            then = self.binary(0)
            self._expect(":")
            arms.append((start, cond, then))
        node = cond
        end = self.tokens[self.i - 1].end
        for start, c, then in reversed(arms):
            node = Cond(c, then, node, start=start, end=end)
        return node

    # Precedence levels, loosest first.
    _LEVELS: tuple[frozenset[str], ...] = (
        frozenset({"||"}),
        frozenset({"&&"}),
        frozenset(_RELATIONS),
        frozenset({"+", "-"}),
        frozenset({"*", "/", "%"}),
    )

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        start = self.tok.start
        left = self.binary(level + 1)
        ops = self._LEVELS[level]
        while self.tok.text in ops and self.tok.kind in ("op", "ident"):
            op = self._take().text
            right = self.binary(level + 1)
            left = self._span(Binary(op, left, right), start)
        return left

    def unary(self) -> Node:
        ops: list[tuple[int, str]] = []  # a run of `!`/`-`, in a loop (no recursion)
        while self._is("!") or self._is("-"):
            ops.append((self.tok.start, self._take().text))
        node = self.member()
        for start, op in reversed(ops):
            node = Unary(op, node, start=start, end=node.end)
        return node

    def member(self) -> Node:
        start = self.tok.start
        node = self.primary()
        while True:
            if self._is("."):
                self._take()
                if self._is("?"):
                    raise ParseError("optional field selection is not analysed", self.tok.start)
                name_start = self.tok.start
                name = self._ident()
                if self._is("("):
                    args = self._args(")")
                    node = self._span(Call(node, name, args, name_start), start)
                else:
                    node = self._span(Select(node, name), start)
            elif self._is("["):
                self._take()
                idx = self.expr()
                self._expect("]")
                node = self._span(Index(node, idx), start)
            else:
                return node

    def _ident(self) -> str:
        if self.tok.kind != "ident":
            raise ParseError(f"expected a name, found {self.tok.text!r}", self.tok.start)
        return self._take().text

    def _args(self, close: str) -> list[Node]:
        self._take()  # the opening bracket
        items: list[Node] = []
        while not self._is(close):
            items.append(self.expr())
            if not self._is(","):
                break
            self._take()
        self._expect(close)
        return items

    def primary(self) -> Node:
        start = self.tok.start
        t = self.tok
        if t.kind in ("string", "bytes", "int", "uint", "double"):
            self._take()
            return self._span(Lit(t.kind, t.text), start)
        if t.kind == "ident":
            self._take()
            if t.text in ("true", "false"):
                return self._span(Lit("bool", t.text), start)
            if t.text == "null":
                return self._span(Lit("null", t.text), start)
            if self._is("("):
                return self._span(Call(None, t.text, self._args(")"), t.start), start)
            if self._is("{"):
                return self._span(MapLit(self._entries(), message=t.text), start)
            return self._span(Ident(t.text), start)
        if self._is("."):
            # A leading dot names a root-scope identifier: `.value` is `value`.
            self._take()
            if self.tok.kind != "ident":
                raise ParseError(f"expected a name after '.', found {self.tok.text or 'end'!r}", self.tok.start)
            return self.primary()
        if self._is("("):
            self._take()
            node = self.expr()
            self._expect(")")
            return node
        if self._is("["):
            return self._span(ListLit(self._args("]")), start)
        if self._is("{"):
            return self._span(MapLit(self._entries()), start)
        raise ParseError(f"unexpected {t.text or 'end'!r}", t.start)

    def _entries(self) -> list[tuple[Node, Node]]:
        self._take()  # '{'
        entries: list[tuple[Node, Node]] = []
        while not self._is("}"):
            k = self.expr()
            self._expect(":")
            entries.append((k, self.expr()))
            if not self._is(","):
                break
            self._take()
        self._expect("}")
        return entries


def parse(src: str | list[Token]) -> Node:
    """Parse ``src`` (text or its tokens) into an AST.

    Raise :class:`ParseError` if it is outside what the analyser understands. The parser
    recurses only into brackets; callers bound their nesting first
    (:func:`listeners.cost.check_tokens`).
    """
    if isinstance(src, str):
        try:
            src = tokenize(src)
        except LexError as exc:
            raise ParseError(str(exc), exc.position) from exc
    try:
        return _Parser(src).parse()
    except RecursionError:
        raise ParseError("nested too deeply to analyse", 0) from None
