"""What synthesis knows of the file it edits: the names its imports bind, and its style.

A rule's template spells names in full (`torch.nn.functional.scaled_dot_product_attention`); the
file's own aliases are used instead where it has them (`F.` after `import torch.nn.functional as
F`, `nn.functional.` after `from torch import nn`), as its author would have written.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from engine.synthesize.style import Style

_DOTTED = re.compile(r"(?<![\w.$])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)")


def module_aliases(tree: ast.Module) -> dict[str, str]:
    """qualified module or object name -> the local name the file's top-level imports bind to it."""
    aliases: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                if a.asname:
                    aliases.setdefault(a.name, a.asname)
                else:
                    top = a.name.partition(".")[0]
                    aliases.setdefault(top, top)
        elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
            for a in stmt.names:
                if a.name != "*":
                    aliases.setdefault(f"{stmt.module}.{a.name}", a.asname or a.name)
    return aliases


@dataclass
class FileContext:
    aliases: dict[str, str] = field(default_factory=dict)
    style: Style = field(default_factory=Style)

    @classmethod
    def of(cls, tree: ast.Module | None, text: str, style: Style | None = None) -> FileContext:
        return cls(module_aliases(tree) if tree is not None else {}, (style or Style()).for_text(text))

    def localize(self, template: str, shadowed: frozenset[str] = frozenset()) -> str:
        """`template` with each dotted name written through the longest alias the file has for a
        prefix of it (only a proper prefix: the rule's own imports still bind a bare name), other
        than an alias the function rebinds (`shadowed`: `B, C, T, F = x.shape`)."""
        if not self.aliases:
            return template

        def shorten(m: re.Match[str]) -> str:
            parts = m.group(1).split(".")
            for cut in range(len(parts) - 1, 0, -1):
                local = self.aliases.get(".".join(parts[:cut]))
                if local is not None and local not in shadowed:
                    return ".".join([local, *parts[cut:]])
            return m.group(1)

        return _DOTTED.sub(shorten, template)
