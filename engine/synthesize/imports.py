"""The file's imports after a rewrite: add what the new code needs, remove what it orphaned.

Both work on the text with the positions of one `ast` parse of the rewritten file: an import line
is inserted after the last top-level import (or the docstring), and an import, or a parameter-free
module built in `__init__` (`self.attend = nn.Softmax(dim=-1)`), that the original code used and
the rewritten code no longer does is deleted. Nothing the rewrite did not orphan is touched: an
import the original never used may be a re-export, and an `__init__.py` is left as it is.
"""

from __future__ import annotations

import ast

# torch.nn modules without parameters or buffers: dropping one leaves the state_dict as it was
PARAMETER_FREE = frozenset(
    f"torch.nn.{name}" for name in ("Softmax", "Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d")
)


def _bound(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.partition(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    return []


def _loads(tree: ast.AST) -> tuple[set[str], set[str]]:
    """Names read, and attribute names read, anywhere in `tree`."""
    names: set[str] = set()
    attrs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
            attrs.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            attrs.add(node.value)  # getattr(self, "attend"), __all__ entries
    return names, attrs


def _qualified(func: ast.expr, aliases: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if not isinstance(func, ast.Name):
        return None
    local_to_qualified = {v: k for k, v in aliases.items()}
    head = local_to_qualified.get(func.id, func.id)
    return ".".join([head, *reversed(parts)])


def _orphan_modules(tree: ast.Module, before_attrs: set[str], after_attrs: set[str],
                    aliases: dict[str, str]) -> list[ast.stmt]:
    found = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name != "__init__":
                continue
            for stmt in fn.body if len(fn.body) > 1 else ():
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)):
                    continue
                target = stmt.targets[0]
                if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self"):
                    continue
                if _qualified(stmt.value.func, aliases) not in PARAMETER_FREE:
                    continue
                if target.attr in before_attrs and target.attr not in after_attrs:
                    found.append(stmt)
    return found


def _without(stmt: ast.Import | ast.ImportFrom, names: set[str], line: str) -> str:
    """The import line `line` of `stmt` without the aliases that bind `names` (its comment kept)."""
    kept = [a for a in stmt.names if (a.asname or (a.name.partition(".")[0] if isinstance(stmt, ast.Import) else a.name))
            not in names]
    spelled = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
    head = line[:len(line) - len(line.lstrip())]
    if isinstance(stmt, ast.Import):
        text = f"import {spelled}"
    else:
        text = f"from {'.' * stmt.level}{stmt.module or ''} import {spelled}"
    comment = line[line.index("#"):].rstrip("\n") if "#" in line[stmt.end_col_offset or 0:] else ""
    return head + text + (f"  {comment}" if comment else "") + "\n"


def tidy_imports(original: str, text: str, needed: list[str], used: set[str], aliases: dict[str, str],
                 is_package_init: bool = False) -> str:
    """`text` with the import lines of `needed` that bind a name in `used` and that the file does
    not bind yet, and without the imports and parameter-free modules that the rewrite orphaned."""
    try:
        tree = ast.parse(text)
        before = ast.parse(original)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    bound = {n for stmt in tree.body for n in _bound(stmt)}
    missing = []
    for line in needed:
        names = _bound(ast.parse(line).body[0])
        if any(n in used for n in names) and not all(n in bound for n in names):
            missing.append(line if line.endswith("\n") else line + "\n")
    delete: set[int] = set()  # 0-based line indexes
    replace: dict[int, str] = {}
    if not is_package_init:
        before_names, before_attrs = _loads(before)
        after_names, after_attrs = _loads(tree)
        for stmt in _orphan_modules(tree, before_attrs, after_attrs, aliases):
            delete.update(range(stmt.lineno - 1, stmt.end_lineno or stmt.lineno))
        after_names_kept = after_names
        if delete:  # a deleted module statement may have been the last reader of an import
            kept_tree = ast.parse("".join(line for i, line in enumerate(lines) if i not in delete))
            after_names_kept, _ = _loads(kept_tree)
        for stmt in tree.body:
            names = _bound(stmt)
            if not names or not isinstance(stmt, (ast.Import, ast.ImportFrom)) or stmt.lineno != stmt.end_lineno \
                    or isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                continue
            orphaned = {n for n in names if n in before_names and n not in after_names_kept}
            if len(orphaned) == len(names):
                delete.add(stmt.lineno - 1)
            elif orphaned:
                replace[stmt.lineno - 1] = _without(stmt, orphaned, lines[stmt.lineno - 1])
    if not missing and not delete and not replace:
        return text
    insert_after = -1  # after this 0-based line
    for i, stmt in enumerate(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            insert_after = (stmt.end_lineno or stmt.lineno) - 1
        elif i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                and isinstance(stmt.value.value, str):
            insert_after = (stmt.end_lineno or stmt.lineno) - 1  # after the module docstring
    out: list[str] = list(missing) if insert_after < 0 else []
    for i, line in enumerate(lines):
        if i not in delete:
            out.append(replace.get(i, line))
        if i == insert_after:
            out.extend(missing)
    return "".join(out)
