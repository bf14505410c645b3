"""A syntax check of CEL expressions (the grammar of cel-spec's langdef.md), as istiod parses a
Telemetry's `accessLogging[].filter.expression` with cel-go before accepting it.

Envoy refuses a listener whose access log filter does not parse, which would reject the proxy's
whole LDS update; refusing the Telemetry instead keeps the rest of the mesh's config flowing.
Only the syntax is checked (no types: Envoy's attributes are dynamic), as cel-go's Parse does.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<string>[rR]?[bB]?[rR]?("""  r'"""' r"""(?:.|\n)*?"""  r'"""' r"""|'''(?:.|\n)*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|\d*\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+[uU]?)
  | (?P<ident>[_a-zA-Z][_a-zA-Z0-9]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])
""", re.VERBOSE)

_RESERVED = {"as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop",
             "package", "namespace", "return", "var", "void", "while"}


# Macros that expand to comprehensions, which Envoy's CEL runtime refuses to build.
_COMPREHENSIONS = {"all", "exists", "exists_one", "map", "filter"}


class CelSyntaxError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CelSyntaxError(f"unexpected character {text[pos]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append((kind, m.group()))
    return out


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.t = tokens
        self.i = 0

    def peek(self, value: str) -> bool:
        return self.i < len(self.t) and self.t[self.i] == ("op", value)

    def take(self, value: str) -> None:
        if not self.peek(value):
            got = self.t[self.i][1] if self.i < len(self.t) else "end of expression"
            raise CelSyntaxError(f"expected {value!r}, got {got!r}")
        self.i += 1

    def accept(self, value: str) -> bool:
        if self.peek(value):
            self.i += 1
            return True
        return False

    def expr(self) -> None:
        self.binary(0)
        if self.accept("?"):
            self.binary(0)
            self.take(":")
            self.expr()

    _LEVELS = (("||",), ("&&",), ("==", "!=", "<", "<=", ">", ">=", "in"), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> None:
        if level == len(self._LEVELS):
            self.unary()
            return
        self.binary(level + 1)
        while any(self._op(o) for o in self._LEVELS[level]):
            self.i += 1
            self.binary(level + 1)

    def _op(self, o: str) -> bool:
        if self.i >= len(self.t):
            return False
        k, v = self.t[self.i]
        return v == o and (k == "op" or (o == "in" and k == "ident"))

    def unary(self) -> None:
        while self.accept("!") or self.accept("-"):
            pass
        self.member()

    def member(self) -> None:
        self.primary()
        while True:
            if self.accept("."):
                name = self.t[self.i][1] if self.i < len(self.t) else ""
                self.ident()
                if self.accept("("):
                    if name in _COMPREHENSIONS:
                        raise CelSyntaxError(f"{name}(): Envoy's CEL has comprehensions (all, exists, exists_one, "
                                             "map, filter) disabled")
                    self.args(")", trailing=False)
            elif self.accept("["):
                self.expr()
                self.take("]")
            elif self.peek("{") and self._last_was_ident:
                self.i += 1
                self.inits("}", field=True)
            else:
                return

    _last_was_ident = False

    def ident(self) -> None:
        if self.i >= len(self.t) or self.t[self.i][0] != "ident" or self.t[self.i][1] in _RESERVED:
            got = self.t[self.i][1] if self.i < len(self.t) else "end of expression"
            raise CelSyntaxError(f"expected an identifier, got {got!r}")
        self.i += 1
        self._last_was_ident = True

    def primary(self) -> None:
        self._last_was_ident = False
        if self.i >= len(self.t):
            raise CelSyntaxError("unexpected end of expression")
        kind, value = self.t[self.i]
        if kind in ("string", "number"):
            self.i += 1
        elif kind == "ident":
            self.ident()
            if self.accept("("):
                self._last_was_ident = False
                self.args(")", trailing=False)
        elif self.accept("."):
            self.ident()
        elif self.accept("("):
            self.expr()
            self.take(")")
        elif self.accept("["):
            self.args("]")
        elif self.accept("{"):
            self.inits("}", field=False)
        else:
            raise CelSyntaxError(f"unexpected {value!r}")

    def args(self, close: str, trailing: bool = True) -> None:
        """A list literal may end with a comma; call arguments may not."""
        self._last_was_ident = False
        if self.accept(close):
            return
        self.expr()
        while self.accept(","):
            if trailing and self.peek(close):
                break
            self.expr()
        self.take(close)

    def inits(self, close: str, field: bool) -> None:
        self._last_was_ident = False
        if self.accept(close):
            return
        while True:
            if field:
                self.ident()
            else:
                self.expr()
            self.take(":")
            self.expr()
            if not self.accept(","):
                break
            if self.peek(close):
                break
        self.take(close)
        self._last_was_ident = False


def check(expression: str) -> None:
    """Raise CelSyntaxError when `expression` is not a CEL expression."""
    tokens = _tokens(expression)
    if not tokens:
        raise CelSyntaxError("empty expression")
    p = _Parser(tokens)
    p.expr()
    if p.i != len(tokens):
        raise CelSyntaxError(f"unexpected {tokens[p.i][1]!r} after a complete expression")
