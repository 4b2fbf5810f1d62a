"""Blocks marked `# Copied from <source>`: rewritten together with their source or not at all.

Repositories such as transformers keep copies of a class or function in sync with a check
(`make fix-copies`, `utils/check_copies.py`): a block headed `# Copied from
transformers.models.bart.modeling_bart.BartAttention with Bart->Whisper` must equal its source after
the replacements. A rewrite of the copy alone would be undone by `fix-copies` (or fail the check); a
rewrite of the source alone would fail it too. So after a scan has rewritten every file, each
marked block is compared with its source as the scan left both: where the copy no longer follows
its source, the rewrites inside the copy and inside its source are withdrawn (a near-miss naming
the copy), and that is repeated until every marked block agrees with its source. A source outside
the scanned files cannot be rewritten with its copy, so the copy is not rewritten either.

Blocks are compared as code and comments, not as laid out (the copy check formats the source after
its replacements: a longer name breaks lines elsewhere). Where the replacements do not reproduce
the copy from the source in the original code (the project's own check knows options this reading
does not), the rule is weaker: the copy and its source must both change or both stay.
"""

from __future__ import annotations

import ast
import builtins
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass
from functools import lru_cache

_MARK = re.compile(r"^\s*#\s*Copied from\s+([\w.]+)(?:\s+with\s+(.*?))?\s*$")


@dataclass(frozen=True)
class Block:
    file: str  # the scan's relative path
    name: str  # qualified name in the file: `BartAttention`, `BartAttention._shape`
    source: str  # the dotted name the mark copies from
    replacements: tuple[tuple[str, str], ...]
    all_casing: bool


def _replacements(text: str | None) -> tuple[tuple[tuple[str, str], ...], bool]:
    if not text:
        return (), False
    pairs = []
    all_casing = False
    for part in text.split(","):
        part = part.strip()
        if part == "all-casing":
            all_casing = True
        elif "->" in part:
            old, _, new = part.partition("->")
            if old.strip():
                pairs.append((old.strip(), new.strip().split(" ")[0]))
    return tuple(pairs), all_casing


def _defs(tree: ast.Module):
    """(qualified name, node) of every class and function, methods included."""
    todo = [("", node) for node in tree.body]
    while todo:
        prefix, node = todo.pop(0)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            yield name, node
            if isinstance(node, ast.ClassDef):
                todo.extend((f"{name}.", child) for child in node.body)


def marked_blocks(text: str, file: str) -> list[Block]:
    """The blocks of `text` headed by a `# Copied from` comment (on the line above the definition or
    its first decorator)."""
    if "Copied from" not in text:
        return []
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    lines = text.splitlines()
    found = []
    for name, node in _defs(tree):
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])  # type: ignore[attr-defined]
        above = lines[first - 2] if first >= 2 else ""
        mark = _MARK.match(above)
        if mark:
            pairs, all_casing = _replacements(mark.group(2))
            found.append(Block(file, name, mark.group(1), pairs, all_casing))
    return found


@lru_cache(maxsize=256)
def _spans(text: str) -> dict[str, tuple[int, int, int]]:
    """Qualified name -> (first line with decorators, `def`/`class` line, last line), per text."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return {}
    return {name: (min([node.lineno, *(d.lineno for d in node.decorator_list)]), node.lineno,  # type: ignore[attr-defined]
                   node.end_lineno or node.lineno)
            for name, node in _defs(tree)}


def block_span(text: str, name: str) -> tuple[int, int] | None:
    """The first and last line of the definition `name` in `text` (decorators included)."""
    span = _spans(text).get(name)
    return None if span is None else (span[0], span[2])


def block_text(text: str, name: str) -> str | None:
    """The source of the definition `name` in `text` (dedented, trailing spaces and blank lines
    dropped), or None where there is none."""
    span = _spans(text).get(name)
    if span is None:
        return None
    lines = text.splitlines()[span[1] - 1:span[2]]
    body = textwrap.dedent("\n".join(lines))
    return "\n".join(line.rstrip() for line in body.splitlines() if line.strip())


def same_code(a: str, b: str) -> bool:
    """Whether two blocks hold the same code and comments, however each is laid out: the copy check
    formats the source's code after its replacements (a longer class name breaks lines elsewhere)."""
    if a == b:
        return True
    try:
        tree_a, tree_b = ast.dump(ast.parse(a)), ast.dump(ast.parse(b))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return tree_a == tree_b and _comments(a) == _comments(b)


def _comments(text: str) -> list[str]:
    try:
        return [tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError):
        return []


def expected(source_text: str, block: Block) -> str:
    """The copy `block` should hold given its source's text: the mark's replacements applied."""
    out = source_text
    for old, new in block.replacements:
        out = out.replace(old, new)
        if block.all_casing:
            out = out.replace(old.lower(), new.lower()).replace(old.upper(), new.upper())
    return out


def resolve(source: str, modules: dict[str, str]) -> tuple[str, str] | None:
    """(file, qualified name) of a dotted source among the scanned modules (module name -> file)."""
    parts = source.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if module in modules:
            return modules[module], ".".join(parts[cut:])
        # `models.bart.modeling_bart.BartModel` written inside the package: the one module it ends
        ending = [m for m in modules if m.endswith("." + module)]
        if len(ending) == 1:
            return modules[ending[0]], ".".join(parts[cut:])
    return None


@dataclass
class Disagreement:
    block: Block
    source: tuple[str, str] | None  # the source's (file, name), None where it was not scanned
    reason: str


def disagreements(blocks: list[Block], modules: dict[str, str], originals: dict[str, str],
                  current: dict[str, str]) -> list[Disagreement]:
    """The marked blocks that the scan's rewrites leave out of step with their sources.
    `originals`/`current`: every involved file's text before and after the rewrites."""
    out = []
    for block in blocks:
        where = resolve(block.source, modules)
        copy_before = block_text(originals.get(block.file, ""), block.name)
        copy_after = block_text(current.get(block.file, ""), block.name)
        if where is None:
            if copy_before != copy_after:
                out.append(Disagreement(block, None, f"it is marked `# Copied from {block.source}`, "
                                                     "which this scan did not read, so it cannot be rewritten with it"))
            continue
        source_before = block_text(originals.get(where[0], ""), where[1])
        source_after = block_text(current.get(where[0], ""), where[1])
        if source_before is None or source_after is None or copy_before is None or copy_after is None:
            continue
        if copy_before == copy_after and source_before == source_after:
            continue
        if same_code(expected(source_before, block), copy_before):
            agrees = same_code(expected(source_after, block), copy_after)
        else:  # the marks' options are more than this reading knows: both change or neither
            agrees = (copy_before != copy_after) == (source_before != source_after)
        if not agrees:
            out.append(Disagreement(block, where, f"it is marked `# Copied from {block.source}`, and the copy and its "
                                                  "source would no longer agree (`make fix-copies` would undo it)"))
    return out


def raw_block(text: str, name: str) -> str | None:
    """The definition `name` in `text` as written (dedented), or None where there is none."""
    span = _spans(text).get(name)
    if span is None:
        return None
    return textwrap.dedent("".join(text.splitlines(keepends=True)[span[1] - 1:span[2]]))


def propagated(copy_file_text: str, block: Block, source_block: str) -> str | None:
    """The copy's file with `block` replaced by its source's (rewritten) code (`source_block`, as
    `raw_block` reads it) after the mark's
    replacements, as the project's own `make fix-copies` writes it; None where that code would read
    a name the copy's file does not bind (an alias only the source's file imports)."""
    span = _spans(copy_file_text).get(block.name)
    if span is None:
        return None
    lines = copy_file_text.splitlines(keepends=True)
    first = lines[span[1] - 1]
    indent = first[:len(first) - len(first.lstrip())]
    new_block = textwrap.indent(expected(source_block, block), indent)
    if not new_block.endswith("\n"):
        new_block += "\n"
    text = "".join(lines[:span[1] - 1]) + new_block + "".join(lines[span[2]:])
    try:
        tree = ast.parse(text)
        old = ast.parse(textwrap.dedent("".join(lines[span[1] - 1:span[2]])))
        new = ast.parse(textwrap.dedent(new_block))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    bound = _module_names(tree) | set(dir(builtins))
    read_before = {n.id for n in ast.walk(old) if isinstance(n, ast.Name)}
    for node in ast.walk(new):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in read_before \
                and node.id not in bound and not _assigned_in(new, node.id):
            return None
    return text


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).partition(".")[0] for a in stmt.names)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return names


def _assigned_in(tree: ast.AST, name: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id == name:
            return True
        if isinstance(node, ast.arg) and node.arg == name:
            return True
    return False

