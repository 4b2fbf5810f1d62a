"""The file's imports after a rewrite: add what the new code needs, remove what it orphaned.

Positions come from the one `ast` parse of the original file (the rewrite replaced whole regions,
so a line outside them is found again by shifting it). An import line is inserted after the last
top-level import (or the docstring); an import, or a parameter-free module built in `__init__`
(`self.attend = nn.Softmax(dim=-1)`), that the original code used and the rewritten code no longer
mentions at all is deleted. Nothing the rewrite did not orphan is touched: an import the original
never used may be a re-export, and an `__init__.py` is left as it is. "Mentions" is a whole-word
search of the text (strings and comments included), which can only keep an import too many.
"""

from __future__ import annotations

import ast
import bisect
import functools
import itertools
import json
import re
import subprocess
from collections.abc import Callable

from engine.extract.imports import qualify_chain
from engine.synthesize.style import _ruff_binary

# torch.nn modules without parameters or buffers: dropping one leaves the state_dict as it was
PARAMETER_FREE = frozenset(
    f"torch.nn.{name}" for name in ("Softmax", "Identity", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d")
)


def bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Import):
        return [a.asname or a.name.partition(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.ImportFrom):
        return [a.asname or a.name for a in stmt.names if a.name != "*"]
    return []


def _mentions(text: str, names: set[str], attrs: set[str], start: int = 0, end: int | None = None,
              starts: list[int] | None = None) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """Where `text` (between the offsets `start` and `end`) mentions each of `names` bare (not after
    a dot) and each of `attrs` as an attribute or quoted (`.attend`, `"attend"`): name -> 0-based
    lines. `starts`: the offsets of the text's lines, where the caller has them."""
    bare: dict[str, set[int]] = {}
    dotted: dict[str, set[int]] = {}
    starts = starts or _line_starts(text, closed=False)
    end = len(text) if end is None else end

    def line_of(offset: int) -> int:
        return bisect.bisect_right(starts, offset) - 1

    if names:
        for m in _bare_pattern(frozenset(names)).finditer(text, start, end):
            bare.setdefault(m.group(1), set()).add(line_of(m.start()))
    if attrs:
        for m in _dotted_pattern(frozenset(attrs)).finditer(text, start, end):
            dotted.setdefault(m.group(1) or m.group(2), set()).add(line_of(m.start()))
    return bare, dotted


def _mentions_edited(original: str, text: str, kept: list[tuple[int, int, int]], before: tuple[dict, dict],
                     names: set[str], attrs: set[str]) -> tuple[dict[str, set[int]], dict[str, set[int]]]:
    """`_mentions(text, names, attrs)` where `text` is `original` with some runs of lines replaced
    and `before` is `_mentions(original, ...)`: the lines `kept` (original first, last, shift, from
    the line map) hold the same text, and so the same mentions, in both; only the lines the
    rewrite wrote are searched. The whole text is searched where that could differ: a kept line
    that is not what it was, or a `.` before a line break at the edge of a kept run (an attribute
    mention may run across it)."""
    old_starts, new_starts = _line_starts(original), _line_starts(text)
    pairs = []  # (first 0-based line in original, in text, line count)
    for first, last, shift in kept:
        a, b = first - 1, first - 1 + shift
        n = min(last - first + 1, len(old_starts) - 1 - a, len(new_starts) - 1 - b)
        if n > 0:
            pairs.append((a, b, n))
    edges: list[tuple[str, int]] = []
    for a, b, n in pairs:
        if original[old_starts[a]:old_starts[a + n]] != text[new_starts[b]:new_starts[b + n]]:
            return _mentions(text, names, attrs)
        edges += [(original, old_starts[a]), (original, old_starts[a + n]), (text, new_starts[b]),
                  (text, new_starts[b + n])]
    if attrs and any(_dot_before(t, at) for t, at in edges):
        return _mentions(text, names, attrs)
    bare: dict[str, set[int]] = {}
    dotted: dict[str, set[int]] = {}
    shifts = [(a, a + n, b - a) for a, b, n in pairs]
    for found, out in ((before[0], bare), (before[1], dotted)):
        for name, lines in found.items():
            moved = {line + d for line in lines for a, end, d in shifts if a <= line < end}
            if moved:
                out[name] = moved
    written, line = [], 0  # runs of lines of `text` that no kept line covers
    for _, b, n in sorted(pairs, key=lambda p: p[1]):
        if b > line:
            written.append((line, b))
        line = max(line, b + n)
    if line < len(new_starts) - 1:
        written.append((line, len(new_starts) - 1))
    for start, end in written:
        found_bare, found_dotted = _mentions(text, names, attrs, new_starts[start], new_starts[end], new_starts)
        for found, out in ((found_bare, bare), (found_dotted, dotted)):
            for name, lines in found.items():
                out.setdefault(name, set()).update(lines)
    return bare, dotted


def _line_starts(text: str, closed: bool = True) -> list[int]:
    """The offset of each line's start (after each `\n`); `closed`: and the text's length where it
    does not end with one (as the start of a line after the last)."""
    parts = text.split("\n")
    starts = [0, *itertools.accumulate(len(part) + 1 for part in parts[:-1])]
    if closed and starts[-1] != len(text):
        starts.append(len(text))
    return starts


def _dot_before(text: str, at: int) -> bool:
    """Whether the text before `at` ends with a `.` and whitespace only."""
    i = at - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return i >= 0 and text[i] == "."


@functools.lru_cache(maxsize=256)
def _bare_pattern(names: frozenset[str]) -> re.Pattern:
    # one alternation (the engine's literal prefilter makes it faster than a pass over every identifier)
    return re.compile(r"(?<![\w.])(" + "|".join(re.escape(n) for n in sorted(names)) + r")\b")


@functools.lru_cache(maxsize=256)
def _dotted_pattern(attrs: frozenset[str]) -> re.Pattern:
    alternatives = "|".join(re.escape(a) for a in sorted(attrs))
    return re.compile(rf"\.\s*({alternatives})\b|[\"']({alternatives})[\"']")


def _unused_imports(text: str) -> set[str] | None:
    """The qualified names of the imports ruff finds unused in `text` (F401), None without ruff.
    ruff knows what a mention is (not a string, not a comment; `__all__` and re-exports kept)."""
    binary = _ruff_binary()
    if binary is None:
        return None
    done = subprocess.run(
        [binary, "check", "--isolated", "--select", "F401", "--output-format", "json", "--exit-zero",
         "--stdin-filename", "module.py", "-"],
        input=text, capture_output=True, text=True, check=False,
    )
    if done.returncode != 0:
        return None
    names = set()
    for item in json.loads(done.stdout or "[]"):
        m = re.match(r"`([^`]+)`", item.get("message", ""))
        if m:
            names.add(m.group(1))
    return names


def _qualified_imports(stmt: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(stmt, ast.Import):
        return [a.name for a in stmt.names]
    prefix = "." * stmt.level + (stmt.module or "")
    return [f"{prefix}.{a.name}" if stmt.module else f"{prefix}{a.name}" for a in stmt.names]


def _outside(where: dict[str, set[int]], name: str, skip: set[int]) -> bool:
    return bool(where.get(name, set()) - skip)


def _module_builds(tree: ast.Module, aliases: dict[str, str]) -> list[tuple[str, ast.stmt]]:
    """(attribute, statement) for each `self.<attribute> = <parameter-free module>(...)` directly in
    an `__init__` body of more than one statement."""
    local_to_qualified = {v: k for k, v in aliases.items()}
    found = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name != "__init__" or len(fn.body) < 2:
                continue
            for stmt in fn.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call):
                    target = stmt.targets[0]
                    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                            and target.value.id == "self" \
                            and qualify_chain(stmt.value.func, local_to_qualified) in PARAMETER_FREE:
                        found.append((target.attr, stmt))
    return found


def _without(stmt: ast.Import | ast.ImportFrom, names: set[str], line: str) -> str:
    """The import line `line` of `stmt` without the aliases that bind `names` (its comment kept)."""
    kept = [a for a, n in zip(stmt.names, bound_names(stmt), strict=False) if n not in names]
    spelled = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in kept)
    head = line[:len(line) - len(line.lstrip())]
    text = f"import {spelled}" if isinstance(stmt, ast.Import) else \
        f"from {'.' * stmt.level}{stmt.module or ''} import {spelled}"
    tail = line[stmt.end_col_offset or 0:]
    comment = tail[tail.index("#"):].rstrip("\n") if "#" in tail else ""
    return head + text + (f"  {comment}" if comment else "") + "\n"


def _owner_of(tree: ast.Module, line: int) -> str | None:
    """The name of the top-level class whose body holds `line` (1-based)."""
    return next((c.name for c in tree.body if isinstance(c, ast.ClassDef)
                 and c.lineno <= line <= (c.end_lineno or c.lineno)), None)


def _read_by_itself(tree: ast.Module, owner: str, attr: str, skip: int | None = None) -> bool:
    """Whether `<x>.<attr>` (or the string `attr`) may be read in `tree` other than as another
    class's own `self.<attr>`: inside class `owner` (but on line `skip`, its construction), or
    anywhere else than in a method of a top-level class unrelated to `owner` by inheritance in the
    file (a subclass or base reads the same attribute), or through another receiver than `self`."""
    classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}

    def bases(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        cls = classes.get(name)
        if cls is None or name in seen:
            return set()
        direct = {b.id for b in cls.bases if isinstance(b, ast.Name)}
        return direct.union(*(bases(b, seen | {name}) for b in direct))

    related = {owner} | bases(owner) | {n for n in classes if owner in bases(n)}
    others = {id(node): name for name, cls in classes.items() if name not in related for node in ast.walk(cls)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == attr:
            return True
        if not isinstance(node, ast.Attribute) or node.attr != attr or node.lineno == skip:
            continue
        if id(node) not in others or not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            return True
    return False


def tidy_imports(original: str, tree: ast.Module, text: str, new_line: Callable[[int], int | None],
                 needed: list[str], used: set[str], aliases: dict[str, str], is_package_init: bool = False,
                 kept: list[tuple[int, int, int]] | None = None) -> str:
    """`text` (the rewrite of `original`, whose parse is `tree`; `new_line` maps an original line to
    its line in `text`, None inside a rewritten region) with the import lines of `needed` that bind
    a name in `used` and that the file does not bind yet, and without the imports and
    parameter-free modules that the rewrite orphaned. `kept`: the runs of original lines that
    `new_line` moves unchanged, as (first, last, shift), where the caller has them: the mentions
    on those lines are then not searched for again."""
    lines = text.splitlines(keepends=True)
    imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
    bound = {n for stmt in imports for n in bound_names(stmt)}
    missing = []
    for line in needed:
        names = bound_names(ast.parse(line).body[0])
        if any(n in used for n in names) and not all(n in bound for n in names):
            missing.append(line if line.endswith("\n") else line + "\n")

    def span(stmt: ast.stmt, mapped: bool) -> set[int] | None:
        start = new_line(stmt.lineno) if mapped else stmt.lineno
        end = new_line(stmt.end_lineno or stmt.lineno) if mapped else stmt.end_lineno or stmt.lineno
        return None if start is None or end is None else set(range(start - 1, end))

    delete: set[int] = set()  # 0-based lines of `text`
    build_lines: set[int] = set()  # the first lines of the deleted module constructions
    replace: dict[int, str] = {}
    if not is_package_init:
        import_lines_before = set().union(*(span(s, False) or set() for s in imports)) if imports else set()
        import_lines_after = set().union(*(span(s, True) or set() for s in imports)) if imports else set()
        builds = [(attr, span(stmt, False), span(stmt, True)) for attr, stmt in _module_builds(tree, aliases)]
        builds = [(attr, before, after) for attr, before, after in builds if before is not None and after is not None]
        import_names = {n for stmt in imports for n in bound_names(stmt)}
        build_attrs = {attr for attr, _, _ in builds}
        bare_before, attrs_before = _mentions(original, import_names, build_attrs)
        bare_after, attrs_after = _mentions(text, import_names, build_attrs) if kept is None else \
            _mentions_edited(original, text, kept, (bare_before, attrs_before), import_names, build_attrs)
        text_tree: list[ast.Module | None] = []
        for attr, where_before, where_after in builds:
            # mentioned elsewhere than its own construction before the rewrite, nowhere after it
            if not _outside(attrs_before, attr, where_before):
                continue
            if not _outside(attrs_after, attr, where_after):
                delete |= where_after
                build_lines.add(min(where_after))
                continue
            # mentioned after it only as other classes' own `self.<attr>` (retro's three attention
            # classes each build and read their own `self.softmax`): orphaned in its class
            if not text_tree:
                try:
                    text_tree.append(ast.parse(text))
                except SyntaxError:
                    text_tree.append(None)
            owner = _owner_of(tree, min(where_before) + 1)
            after_tree = text_tree[0]
            if owner is not None and after_tree is not None and _read_by_itself(tree, owner, attr, skip=min(where_before) + 1) \
                    and not _read_by_itself(after_tree, owner, attr, skip=min(where_after) + 1):
                delete |= where_after
                build_lines.add(min(where_after))
        kept_text = None
        unused_before: set[str] | None = None
        unused_after: set[str] | None = None
        for stmt in imports:
            names = bound_names(stmt)
            where = span(stmt, True)
            if not names or where is None or stmt.lineno != stmt.end_lineno \
                    or isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
                continue
            orphaned = set()
            for n, q in zip(names, _qualified_imports(stmt), strict=False):
                before = len(bare_before.get(n, set()) - import_lines_before)
                after = len(bare_after.get(n, set()) - import_lines_after - delete)
                if not before or after >= before:
                    continue  # never used (maybe a re-export), or no fewer mentions than before
                if not after:
                    orphaned.add(n)  # not one mention left
                    continue
                # fewer mentions, some left: ruff tells whether those are uses (not strings or comments)
                if kept_text is None:
                    kept_text = "".join(line for i, line in enumerate(lines) if i not in delete)
                    unused_after = _unused_imports(kept_text)
                if unused_after is not None and q in unused_after:
                    if unused_before is None:
                        unused_before = _unused_imports(original) or set()
                    if q not in unused_before:
                        orphaned.add(n)
            if len(orphaned) == len(names):
                delete |= where
            elif orphaned:
                (index,) = where
                replace[index] = _without(stmt, orphaned, lines[index])
    for index in sorted(build_lines):  # the comment lines heading a deleted construction alone go with it
        above = index - 1
        while above >= 0 and above not in delete and lines[above].lstrip().startswith("#"):
            above -= 1
        below = index + 1
        while below in delete:
            below += 1
        if above < index - 1 and (above < 0 or not lines[above].strip()) \
                and (below >= len(lines) or not lines[below].strip()):
            delete |= set(range(above + 1, index))
    for index in sorted(delete):  # a deleted line between two blank ones leaves one blank line, not two
        before, after = index - 1, index + 1
        while before in delete:
            before -= 1
        while after in delete:
            after += 1
        if 0 <= before and after < len(lines) and not lines[before].strip() and not lines[after].strip():
            delete = delete | {after}
    if not missing and not delete and not replace:
        return text
    insert_after = -1  # after this 0-based line of `text`
    for i, stmt in enumerate(tree.body):
        is_doc = i == 0 and isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
            and isinstance(stmt.value.value, str)
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) or is_doc:
            end = new_line(stmt.end_lineno or stmt.lineno)
            if end is not None:
                insert_after = end - 1
    out: list[str] = list(missing) if insert_after < 0 else []
    for i, line in enumerate(lines):
        if i not in delete:
            out.append(replace.get(i, line))
        if i == insert_after:
            out.extend(missing)
    return "".join(out)
