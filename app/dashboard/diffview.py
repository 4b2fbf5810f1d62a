"""A unified diff as HTML: lines coloured by kind, Python tokens highlighted with Pygments.

Highlighting happens here on the server (no script, no CDN). Every line keeps its ``+``/``-``
marker as text, so the meaning never depends on colour.
"""

from __future__ import annotations

from html import escape

from markupsafe import Markup
from pygments.lexers import PythonLexer
from pygments.token import Comment, Keyword, Name, Number, Operator, String

MAX_DIFF_LINES = 5000  # beyond this the rest is shown plain (a page must stay usable)

_LEXER = PythonLexer(stripnl=False, ensurenl=False)
_CLASSES = [(Comment, "c"), (String, "s"), (Number, "m"), (Keyword, "k"), (Name.Builtin, "nb"),
            (Name.Function, "nf"), (Name.Class, "nc"), (Name.Decorator, "nd"), (Operator, "o")]


def _token_class(token) -> str | None:
    for kind, css in _CLASSES:
        if token in kind:
            return css
    return None


def highlight_python(code: str) -> str:
    out = []
    for token, text in _LEXER.get_tokens(code):
        css = _token_class(token)
        out.append(f'<span class="{css}">{escape(text)}</span>' if css else escape(text))
    return "".join(out)


def render_diff(diff: str | None) -> Markup:
    """``<pre>`` of the diff: one ``<span class="dl ...">`` per line (add, del, hunk, file, ctx)."""
    if not diff:
        return Markup('<p class="muted">No changes.</p>')
    lines = diff.splitlines()
    out = ['<pre class="diff" tabindex="0" aria-label="unified diff"><code>']
    python = True
    for n, line in enumerate(lines):
        if n >= MAX_DIFF_LINES:
            out.append(f'<span class="dl ctx">… {len(lines) - n} more lines not shown</span>')
            break
        if line.startswith(("+++", "---")):
            python = line.rstrip().endswith(".py")
            out.append(f'<span class="dl file">{escape(line)}</span>')
        elif line.startswith("@@"):
            out.append(f'<span class="dl hunk">{escape(line)}</span>')
        else:
            kind = {"+": "add", "-": "del"}.get(line[:1], "ctx")
            body = highlight_python(line[1:]) if python else escape(line[1:])
            out.append(f'<span class="dl {kind}"><span class="mark">{escape(line[:1]) or " "}</span>{body}</span>')
    out.append("</code></pre>")
    return Markup("".join(out))
