"""Import and alias resolution: map a local name to the fully qualified name it stands for.

Handles `import torch.nn as nn`, `import torch`, `from torch import nn`, `from torch.nn import
functional as F`, relative imports inside a package (`from ...activations import ACT2FN` in
`transformers.models.bert.modeling_bert` is `transformers.activations.ACT2FN`), imports under
`if`/`try` at module level, module-level aliases (`LayerNorm = nn.LayerNorm`), and names defined in
the module itself (qualified with the module's own name).
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name_for(path: Path) -> str:
    """Dotted module name of a file, found by walking up through packages (`__init__.py`)."""
    path = Path(path).resolve()
    parts = [path.stem]
    parent = path.parent
    while (parent / "__init__.py").exists():
        parts.append(parent.name)
        if parent.parent == parent:
            break
        parent = parent.parent
    return ".".join(reversed(parts))


class Imports:
    """Local name -> qualified name for one module."""

    def __init__(self, tree: ast.Module, module: str, is_package: bool = False) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.names: dict[str, str] = {}
        self.local: set[str] = set()  # classes and functions defined in the module
        self._scan(tree.body)

    def _scan(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        self.names[alias.asname] = alias.name
                    else:
                        top = alias.name.partition(".")[0]
                        self.names[top] = top
            elif isinstance(stmt, ast.ImportFrom):
                base = self._from_base(stmt)
                for alias in stmt.names:
                    if alias.name == "*":
                        continue
                    self.names[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
            elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                self.local.add(stmt.name)
                self.names[stmt.name] = f"{self.module}.{stmt.name}" if self.module else stmt.name
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name):
                    resolved = self.qualify(stmt.value)
                    if resolved is not None and resolved != target.id:
                        self.names[target.id] = resolved
            elif isinstance(stmt, ast.If):
                self._scan(stmt.body)
                self._scan(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                self._scan(stmt.body)
                for handler in stmt.handlers:
                    self._scan(handler.body)
                self._scan(stmt.orelse)

    def _from_base(self, stmt: ast.ImportFrom) -> str:
        if not stmt.level:
            return stmt.module or ""
        parts = self.package.split(".") if self.package else []
        up = stmt.level - 1
        if up:
            parts = parts[:-up] if up <= len(parts) else []
        if stmt.module:
            parts = [*parts, stmt.module]
        return ".".join(p for p in parts if p)

    def qualify(self, expr: ast.expr) -> str | None:
        """The qualified name of a Name/Attribute chain (`nn.functional.softmax` ->
        `torch.nn.functional.softmax`), or None when the expression is not such a chain."""
        return qualify_chain(expr, self.names)


def name_chain(expr: ast.expr) -> list[str] | None:
    """The names of a Name/Attribute chain, head first (`a.b.c` -> a, b, c); None for any other
    expression."""
    attrs: list[str] = []
    while isinstance(expr, ast.Attribute):
        attrs.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    return [expr.id, *reversed(attrs)]


def qualify_chain(expr: ast.expr, names: dict[str, str]) -> str | None:
    """The qualified name of a Name/Attribute chain, its head looked up in `names` (local name ->
    qualified name; unknown heads stand for themselves); None for any other expression."""
    chain = name_chain(expr)
    if chain is None:
        return None
    return ".".join([names.get(chain[0], chain[0]), *chain[1:]])
