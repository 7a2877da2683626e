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


# Order matters: longer operators first, triple quotes before single ones.
_STRING = r"""(?P<prefix>[rRbB]{0,2})(?P<quote>\"\"\"|'''|"|')"""
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("ws", re.compile(r"\s+|//[^\n]*")),
    ("double", re.compile(r"(\d+\.\d*|\.\d+)([eE][+-]?\d+)?|\d+[eE][+-]?\d+")),
    ("uint", re.compile(r"(0[xX][0-9a-fA-F]+|\d+)[uU]")),
    ("int", re.compile(r"0[xX][0-9a-fA-F]+|\d+")),
    ("string", re.compile(_STRING)),
    ("ident", re.compile(r"[A-Za-z_][A-Za-z0-9_]*")),
    ("op", re.compile(r"==|!=|<=|>=|&&|\|\||[<>+\-*/%!?:.,()\[\]{}]")),
]


def _scan_string(src: str, pos: int, prefix: str, quote: str) -> int:
    """Return the end offset of the string literal whose opening quote ends at ``pos``."""
    raw = "r" in prefix.lower()
    i = pos
    while i < len(src):
        if src.startswith(quote, i):
            return i + len(quote)
        ch = src[i]
        if ch == "\\" and not raw:
            i += 2
            continue
        if ch == "\n" and len(quote) == 1:
            break
        i += 1
    raise LexError("unterminated string literal", pos - len(quote) - len(prefix))


def tokenize(src: str) -> list[Token]:
    """Split ``src`` into tokens (whitespace and comments dropped), ending with an ``eof``."""
    tokens: list[Token] = []
    pos = 0
    n = len(src)
    while pos < n:
        for kind, pattern in _PATTERNS:
            m = pattern.match(src, pos)
            if not m or m.end() == pos:
                continue
            if kind == "string":
                prefix, quote = m.group("prefix"), m.group("quote")
                # A prefix that is not r/b/rb/br is an identifier followed by a quote: not ours.
                if prefix and prefix.lower() not in ("r", "b", "rb", "br"):
                    continue
                end = _scan_string(src, m.end(), prefix, quote)
                kind = "bytes" if "b" in prefix.lower() else "string"
                tokens.append(Token(kind, src[pos:end], pos, end))
                pos = end
            else:
                if kind != "ws":
                    tokens.append(Token(kind, m.group(), pos, m.end()))
                pos = m.end()
            break
        else:
            raise LexError(f"unexpected character {src[pos]!r}", pos)
    tokens.append(Token("eof", "", n, n))
    return tokens
