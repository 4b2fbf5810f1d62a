"""Lexical conventions shared by the DSL printer and parser: how names, texts, strings, numbers and
positions are written. The terminals here mirror those of ``structure.lark``; docs/dsl.md documents
them for rule authors.
"""

from __future__ import annotations

import ast
import math
import re

from engine.dsl.ir import Pos

# A name is written bare when it matches WORD and is not a keyword of the grammar; otherwise it is
# written as a text (backticks). Keep in sync with WORD in structure.lark.
WORD_RE = re.compile(r"\.?(?:[^\W\d]\w*|\?)(?:[.:][^\W\d]\w*|\.\d+|\[[^\[\]\s`]*\])*")

# Words the lexer may read as keywords or literals rather than as a WORD.
RESERVED = frozenset({
    "file", "module", "diag", "class", "init", "def", "note", "if", "and", "not", "via",
    "True", "False", "None", "inf", "nan",
})


class DSLSyntaxError(ValueError):
    """A DSL text that does not parse. ``line`` and ``column`` are 1-based (0 when unknown)."""

    def __init__(self, message: str, line: int = 0, column: int = 0, source_line: str | None = None):
        self.message = message
        self.line = line
        self.column = column
        self.source_line = source_line
        where = f"line {line}, column {column}: " if line else ""
        full = where + message
        if source_line is not None and line:
            full += "\n    " + source_line + "\n    " + " " * max(column - 1, 0) + "^"
        super().__init__(full)


# ---------------------------------------------------------------------------------------------
# Texts: `verbatim` or e`escaped`

_SHORT_ESCAPES = {"\\": "\\\\", "`": "\\`", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNESCAPE_RE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)", re.S)
_UNESCAPE_SIMPLE = {"\\": "\\", "`": "`", "n": "\n", "r": "\r", "t": "\t"}


def quote_text(text: str) -> str:
    """`text` when it is printable and holds no backtick, else e`...` with backslash escapes."""
    if "`" not in text and text.isprintable():
        return f"`{text}`"
    out = []
    for ch in text:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000
                       else f"\\U{code:08x}")
    return "e`" + "".join(out) + "`"


def unquote_text(token: str) -> str:
    """Inverse of ``quote_text``. Raises ValueError on an unknown escape."""
    if token.startswith("`"):
        return token[1:-1]
    if not token.startswith("e`"):
        raise ValueError(f"not a text: {token!r}")

    def repl(match: re.Match[str]) -> str:
        esc = match.group(1)
        if esc[0] in "xuU" and len(esc) > 1:
            return chr(int(esc[1:], 16))
        if esc in _UNESCAPE_SIMPLE:
            return _UNESCAPE_SIMPLE[esc]
        raise ValueError(f"unknown escape \\{esc} in text (known: \\\\ \\` \\n \\r \\t \\xHH \\uHHHH \\UHHHHHHHH)")

    return _UNESCAPE_RE.sub(repl, token[2:-1])


def is_bare(name: str) -> bool:
    return name not in RESERVED and WORD_RE.fullmatch(name) is not None


def quote_name(name: str) -> str:
    """A name (op, layer type, target, attribute, variable, keyword ...) bare if it can be."""
    return name if is_bare(name) else quote_text(name)


# ---------------------------------------------------------------------------------------------
# Python string literals (free text: paths, messages, notes, and string constants)


def quote_string(value: str) -> str:
    """A double-quoted Python string literal; non-printable characters escaped as repr does."""
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])
    out.append('"')
    return "".join(out)


def unquote_string(token: str) -> str | bytes:
    value = ast.literal_eval(token)
    if not isinstance(value, str | bytes):  # the STRING terminal admits nothing else
        raise ValueError(f"not a string literal: {token}")
    return value


# ---------------------------------------------------------------------------------------------
# Numbers


def format_number(value: int | float) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    return repr(int(value))


def parse_number(token: str) -> int | float:
    if token in ("inf", "-inf", "nan"):
        return float(token)
    if any(c in token for c in ".eE"):
        return float(token)
    return int(token)


# ---------------------------------------------------------------------------------------------
# Positions: @line:col-end_col, @line:col-end_line:end_col, @"file":..., @line (diagnostics)

POS_RE = re.compile(r'@(?:("(?:[^"\\\r\n]|\\[^\r\n])*"):)?(\d+)(?::(\d+)(?:-(?:(\d+):)?(\d+))?)?')


def format_pos(pos: Pos, path: str) -> str:
    where = "" if pos.file == path else quote_string(pos.file) + ":"
    for n in (pos.line, pos.col, pos.end_line, pos.end_col):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"position numbers must be non-negative ints: {pos!r}")
    end = f"{pos.end_col}" if pos.end_line == pos.line else f"{pos.end_line}:{pos.end_col}"
    return f"@{where}{pos.line}:{pos.col}-{end}"


def format_line_pos(file: str, line: int, path: str) -> str:
    if not isinstance(line, int) or isinstance(line, bool) or line < 0:
        raise ValueError(f"a line must be a non-negative int: {line!r}")
    where = "" if file == path else quote_string(file) + ":"
    return f"@{where}{line}"


def parse_pos(token: str, path: str) -> tuple[str, int, int | None, int | None, int | None]:
    """(file, line, col, end_line, end_col); col and ends are None when absent."""
    match = POS_RE.fullmatch(token)
    if match is None:
        raise ValueError(f"malformed position {token}")
    file_tok, line, col, end_line, end_col = match.groups()
    file = unquote_string(file_tok) if file_tok else path
    if not isinstance(file, str):
        raise ValueError("a position's file must be a str literal")
    line_i = int(line)
    if col is None:
        return file, line_i, None, None, None
    if end_col is None:
        return file, line_i, int(col), None, None
    return file, line_i, int(col), int(end_line) if end_line else line_i, int(end_col)
