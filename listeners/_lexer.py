"""A small CEL tokenizer, used only to *analyse* expressions the CEL library has accepted.

The CEL library (``cel``) is the authority on syntax and evaluation; it does not expose its
AST, so fifolane re-reads the text to learn which variables and fields an expression uses and
whether it has an indexable equality conjunct. Anything this lexer does not understand makes
the analysis fall back to the conservative answer ("needs the whole value, not indexable").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LexError", "Token", "tokenize"]


class LexError(ValueError):
    """The text has a token this lexer does not know (the analysis then gives up)."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True, slots=True)
class Token:
    """One token: ``kind`` is ``ident``, ``string``, ``bytes``, ``int``, ``uint``, ``double``,
    ``op`` or ``eof``; ``text`` is the exact source slice; ``start``/``end`` are offsets."""

    kind: str
    text: str
    start: int
    end: int


# One master pattern; alternatives are tried in order, so longer forms come first.
# Raw strings (r"...") have no escapes; others may escape the quote with a backslash.
_RAW_STR = r'''(?:[rR][bB]?|[bB][rR])(?:"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"[^"\n]*"|'[^'\n]*')'''
_STR = (
    r'''[bB]?(?:"""(?:\\[\s\S]|[^\\])*?"""|\'\'\'(?:\\[\s\S]|[^\\])*?\'\'\''''
    r"""|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')"""
)
_MASTER = re.compile(
    "|".join(
        [
            r"(?P<ws>\s+|//[^\n]*)",
            rf"(?P<string>{_RAW_STR}|{_STR})",
            r"(?P<double>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+)",
            r"(?P<uint>(?:0[xX][0-9a-fA-F]+|\d+)[uU])",
            r"(?P<int>0[xX][0-9a-fA-F]+|\d+)",
            r"(?P<ident>[A-Za-z_][A-Za-z0-9_]*)",
            r"(?P<op>==|!=|<=|>=|&&|\|\||[<>+\-*/%!?:.,()\[\]{}])",
        ]
    )
)


def tokenize(src: str) -> list[Token]:
    """Split ``src`` into tokens (whitespace and comments dropped), ending with an ``eof``."""
    tokens: list[Token] = []
    pos = 0
    n = len(src)
    match = _MASTER.match
    while pos < n:
        m = match(src, pos)
        if m is None:
            raise LexError(f"unexpected character {src[pos]!r}", pos)
        kind = m.lastgroup or "op"
        end = m.end()
        if kind == "string":
            text = m.group()
            quote = min(i for i in (text.find('"'), text.find("'")) if i >= 0)
            kind = "bytes" if "b" in text[:quote].lower() else "string"
            tokens.append(Token(kind, text, pos, end))
        elif kind != "ws":
            tokens.append(Token(kind, m.group(), pos, end))
        pos = end
    tokens.append(Token("eof", "", n, n))
    return tokens
