"""Classes of other files of the scanned repository: a base class imported from another module of
the same package gives its `__init__`'s layers to the subclass, as a base class of the same file does.

`class MixMIMWindowAttention(WindowMSA)` with `from ..utils import WindowMSA` builds `self.softmax`,
`self.attn_drop` and `self.qkv` in `WindowMSA.__init__`, in `utils/attention.py`, which
`utils/__init__.py` re-exports; its `forward` is matched only knowing them.

Resolution is static and bounded: only the files the scan found (`files`, paths relative to
`root`) are read, each parsed on first use and kept; no import is executed. A name resolves when
each module on the way binds it exactly once, by a class definition or by an explicit import that
is followed in turn (at most `MAX_HOPS` of them). Anything else resolves to nothing, and the base
then gives no facts, as a base from outside the repository does: a module with a star import
(which may bind any name), a name bound twice (under `if`/`try` or by reassignment), a module that
is not one of the repository's files, or a module path that several of its folders could hold.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from engine.dsl.ir import ClassModel, LayerDef
from engine.extract.imports import module_name_for, name_chain
from engine.repo_files import UnsafePath, read_inside

MAX_HOPS = 8  # re-exports followed for one name
MAX_FILE_BYTES = 2_000_000  # as the scan: larger files are never read
_WORD = re.compile(r"\w+")


class PackageIndex:
    """The Python files of one repository, read lazily, and the layers their classes build."""

    def __init__(self, root: Path | str, files: Iterable[str], module_of: Callable[[str], str] | None = None,
                 prefix: str = "") -> None:
        """`files`: the repository's Python files as the scan names them, `prefix` and then the path
        relative to `root`; `module_of`: a file's dotted module name (default: found from the
        package layout)."""
        self.root = Path(root)
        self.files = frozenset(files)
        self.prefix = prefix
        self._module_of = module_of
        self._parsed: dict[str, tuple[str, ast.Module] | None] = {}
        self._layers: dict[tuple[str, str], tuple[LayerDef, ...] | None] = {}
        self._found: dict[tuple[str, str], tuple[str, str] | None] = {}  # (module, name) -> lookup's answer
        self._modules: dict[tuple[str, int, str], str | None] = {}  # (folder, level, module) -> its file
        self._tables: list[tuple[ast.Module, dict[str, list[ast.stmt]] | None]] = []  # see `binding`
        self._busy: set[tuple[str, str]] = set()  # classes whose layers are being computed (a cycle)
        self._texts: dict[str, str | None] = {}  # file -> its text, where `text` read it
        self._models: dict[tuple[str, str], ClassModel | None] = {}  # see `class_model`
        self._words: dict[str, frozenset[str] | None] | None = None  # file -> the words of its text

    def module_of(self, rel: str) -> str:
        if self._module_of is not None:
            return self._module_of(rel)
        return module_name_for(self.root / rel.removeprefix(self.prefix))

    def source(self, rel: str) -> tuple[str, ast.Module] | None:
        """The text and parse of a file of the repository; None where it is not one, cannot be read
        or does not parse."""
        if rel in self._parsed:
            return self._parsed[rel]
        found: tuple[str, ast.Module] | None = None
        if rel in self.files:
            try:
                raw = read_inside(self.root, rel.removeprefix(self.prefix))
                if len(raw) <= MAX_FILE_BYTES:
                    text = raw.decode("utf-8")
                    found = (text, ast.parse(text, filename=rel))
            except (UnsafePath, OSError, UnicodeDecodeError, SyntaxError, ValueError, RecursionError, MemoryError):
                found = None
        self._parsed[rel] = found
        return found

    def text(self, rel: str) -> str | None:
        """The text of a file of the repository, read without parsing it; None where it is not one
        or cannot be read."""
        if rel not in self._texts:
            found = self._parsed.get(rel)
            text = found[0] if found is not None else None
            if found is None and rel in self.files:
                try:
                    raw = read_inside(self.root, rel.removeprefix(self.prefix))
                    text = raw.decode("utf-8") if len(raw) <= MAX_FILE_BYTES else None
                except (UnsafePath, OSError, UnicodeDecodeError, ValueError):
                    text = None
            self._texts[rel] = text
        return self._texts[rel]

    def mentions(self, rel: str, words: Iterable[str]) -> bool:
        """Whether the text of a file of the repository holds one of `words` (a file that cannot be
        read holds none)."""
        text = self.text(rel) or ""
        return any(word in text for word in words)

    def remember(self, rel: str, text: str, tree: ast.Module) -> None:
        """The scan's own parse of a file, kept for when another file's class derives from one of it."""
        if rel in self.files and rel not in self._parsed:
            self._parsed[rel] = (text, tree)

    def mentioned_elsewhere(self, name: str, besides: str) -> bool:
        """Whether a file of the repository other than `besides` holds `name` as a word (an import
        of it, a call, a string naming it): the callers of a private helper are then not all in
        its own file. A file that cannot be read as text may hold it. Each file's words are read
        once, at the first question."""
        if self._words is None:
            self._words = {}
            for rel in self.files:
                text = self.text(rel)
                self._words[rel] = None if text is None else frozenset(_WORD.findall(text))
        return any(words is None or name in words for rel, words in self._words.items() if rel != besides)

    # -- layers ------------------------------------------------------------------------------

    def base_layers(self, rel: str, tree: ast.Module, base: ast.expr) -> tuple[LayerDef, ...]:
        """The layers that the `__init__`s of the base class `base` (an expression of the bases of a
        class of the file `rel`, whose parse is `tree`) and of its own bases build, where `base` is
        a class of another file of the repository; else none."""
        where = self.resolve(rel, tree, base)
        if where is None:
            return ()
        return self.class_layers(*where) or ()

    def class_layers(self, rel: str, name: str) -> tuple[LayerDef, ...] | None:
        key = (rel, name)
        if key in self._layers:
            return self._layers[key]
        if key in self._busy:
            return None  # a cycle of imports: the class derives from itself
        found = self.source(rel)
        if found is None:
            return None
        from engine.extract.extractor import class_layers  # the extractor calls this module back

        self._busy.add(key)
        try:
            layers = class_layers(found[1], found[0], rel, self.module_of(rel), name, self)
        finally:
            self._busy.discard(key)
        self._layers[key] = layers
        return layers

    def class_model(self, rel: str, name: str) -> ClassModel | None:
        """The extracted class `name` of the file `rel` (layers and methods), read once: what a call
        of one of its instances returns is derived from its `forward` (engine.analysis.shapes)."""
        key = (rel, name)
        if key in self._models:
            return self._models[key]
        self._models[key] = None  # a class whose extraction asks for itself gets nothing
        found = self.source(rel)
        if found is None:
            return None
        from engine.extract.extractor import class_model

        model = self._models[key] = class_model(found[1], found[0], rel, self.module_of(rel), name, self)
        return model

    def type_class(self, rel: str, qualified: str) -> tuple[str, str] | None:
        """(file, class name) of the repository's class that the dotted type `qualified` (as the
        extractor qualifies a layer's type in the file `rel`) names; None where no one file of the
        repository defines it."""
        module, _, name = qualified.rpartition(".")
        if not module or not name.isidentifier():
            return None
        target = self.module_file(rel, 0, module)
        return self.lookup(target, name, 0) if target is not None else None

    # -- names -------------------------------------------------------------------------------

    def binding(self, tree: ast.Module, name: str) -> ast.stmt | None:
        """The one statement of the module `tree`'s top level that binds `name`; None where none or
        several do, or where a star import may. The last trees' tables are kept (a file's classes
        ask one after another)."""
        table = next((t for held, t in self._tables if held is tree), False)
        if table is False:
            table = bindings(tree)
            self._tables = [(tree, table), *self._tables[:7]]  # holding the tree keeps its identity
        statements = table.get(name, ()) if table is not None else ()
        return statements[0] if len(statements) == 1 else None

    def resolve(self, rel: str, tree: ast.Module, expr: ast.expr) -> tuple[str, str] | None:
        """(file, class name) of the class that `expr` (a name or a dotted chain of names) stands
        for in the module `rel`, where another file of the repository defines it; else None."""
        chain = name_chain(expr)
        if chain is None:
            return None
        binding = self.binding(tree, chain[0])
        if isinstance(binding, ast.ImportFrom):
            alias = next(a for a in binding.names if (a.asname or a.name) == chain[0])
            target = self.module_file(rel, binding.level, binding.module or "")
            if len(chain) == 1:
                return self.lookup(target, alias.name, 0) if target is not None else None
            # `from pkg import module` and `module.Class`: the name is a submodule
            prefix = [binding.module] if binding.module else []
            target = self.module_file(rel, binding.level, ".".join([*prefix, alias.name, *chain[1:-1]]))
            return self.lookup(target, chain[-1], 0) if target is not None else None
        if isinstance(binding, ast.Import) and len(chain) > 1:
            alias = next(a for a in binding.names if (a.asname or a.name.partition(".")[0]) == chain[0])
            module = ".".join(chain[:-1]) if not alias.asname else alias.name if len(chain) == 2 else None
            if module != alias.name:
                return None  # `import a.b` and `a.c.Class`: `a.c` is imported elsewhere, or not at all
            target = self.module_file(rel, 0, module)
            return self.lookup(target, chain[-1], 0) if target is not None else None
        return None

    def lookup(self, rel: str, name: str, hops: int) -> tuple[str, str] | None:
        """Where the name `name` of module `rel` is a class: defined there, or re-exported from
        another module of the repository by an explicit import."""
        key = (rel, name)
        if key in self._found:
            return self._found[key]
        found = self.source(rel)
        if found is None or hops > MAX_HOPS:
            return None
        answer: tuple[str, str] | None = None
        binding = self.binding(found[1], name)
        if isinstance(binding, ast.ClassDef):
            answer = rel, name
        elif isinstance(binding, ast.ImportFrom):
            alias = next(a for a in binding.names if (a.asname or a.name) == name)
            target = self.module_file(rel, binding.level, binding.module or "")
            answer = self.lookup(target, alias.name, hops + 1) if target is not None else None
        self._found[key] = answer
        return answer

    def module_file(self, rel: str, level: int, module: str) -> str | None:
        """The repository's file of the module `module` imported from file `rel` (`level` dots of a
        relative import): `a/b.py` or `a/b/__init__.py`. An absolute module is looked for under the
        repository's root and every folder holding `rel`; None unless exactly one file is found."""
        folders = rel.split("/")[:-1]
        key = ("/".join(folders), level, module)
        if key in self._modules:
            return self._modules[key]
        parts = [p for p in module.split(".") if p]
        if level:
            if level - 1 > len(folders):
                return None  # above the repository
            anchors = [folders[:len(folders) - (level - 1)]]
        else:
            anchors = [folders[:i] for i in range(len(folders), -1, -1)] if parts else []
        found: set[str] = set()
        for anchor in anchors:
            stem = "/".join([*anchor, *parts])
            for candidate in (f"{stem}.py", f"{stem}/__init__.py") if parts else (f"{stem}/__init__.py",):
                candidate = candidate.lstrip("/")
                if candidate in self.files:
                    found.add(candidate)
        answer = found.pop() if len(found) == 1 else None
        self._modules[key] = answer
        return answer


def bindings(tree: ast.Module) -> dict[str, list[ast.stmt]] | None:
    """Each name the module's top level binds (inside `if`, `try`, loops and `with` too) -> the
    statements binding it; None where a star import may bind any name."""
    found: dict[str, list[ast.stmt]] = {}
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, ast.ImportFrom) and any(a.name == "*" for a in stmt.names):
            return None
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                bound = alias.asname or (alias.name.partition(".")[0] if isinstance(stmt, ast.Import) else alias.name)
                found.setdefault(bound, []).append(stmt)
        elif isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(stmt.name, []).append(stmt)
        else:
            for target in _targets(stmt):  # an assignment, a loop, a `with` or a `del`
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        found.setdefault(n.id, []).append(stmt)
            for block in ("body", "orelse", "finalbody"):  # `if`, `try`, `for`, `while`, `with`
                todo.extend(getattr(stmt, block, ()))
            for handler in getattr(stmt, "handlers", ()):
                todo.extend(handler.body)
    return found

def _targets(stmt: ast.stmt) -> list[ast.expr]:
    """The names a statement other than an import or a definition assigns to (or deletes)."""
    if isinstance(stmt, (ast.Assign, ast.Delete)):
        return stmt.targets
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
        return [stmt.target]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [item.optional_vars for item in stmt.items if item.optional_vars is not None]
    return []


_CURRENT: ContextVar[PackageIndex | None] = ContextVar("adopter_package", default=None)


@contextmanager
def using(index: PackageIndex | None) -> Iterator[None]:
    """Make `index` the repository whose files the extractions inside (a scan's, and synthesis's
    extractions of the rewritten text again) resolve base classes in."""
    token = _CURRENT.set(index)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> PackageIndex | None:
    """The repository `using` made known, if any."""
    return _CURRENT.get()
