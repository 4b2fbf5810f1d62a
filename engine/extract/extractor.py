"""Python source -> DSL structure (engine.dsl.ir), without importing or running the code.

One pass over the `ast` of a file:
  * every class that is (or may be) an `nn.Module` gets its `__init__` layer table and, per method,
    a flat sequence of DL nodes;
  * nested calls are unchained into temporaries, every assignment creates a new SSA name, branches
    put a guard on their nodes and merge with `phi` nodes;
  * calls of helper methods of the class and of module-level functions are inlined (bounded depth),
    the inlined nodes keep the callee's positions and record the call site in `via`; so are calls
    of a submodule built from a class of the file whose `forward` reads no state (a scorer).
`ast` (not libcst) is used here for speed: the corpus benchmark holds extraction to a small multiple
of `ast.parse` alone. Synthesis, which edits code, uses libcst.
"""

from __future__ import annotations

import ast
import contextvars
import gc
import re
from dataclasses import dataclass, field, fields
from itertools import accumulate
from pathlib import Path
from typing import Any

from engine.dsl import canonical as C
from engine.dsl.ir import (
    HELPER_CONDITION,
    ClassModel,
    Cond,
    Const,
    Diagnostic,
    FileModel,
    LayerDef,
    Method,
    Node,
    Operand,
    Param,
    Pos,
    Seq,
    Sym,
    Var,
)
from engine.extract.imports import Imports, module_name_for

MAX_INLINE_DEPTH = 3
MAX_BASE_FILES = 4  # other files of the repository a method is looked for in, along a chain of bases
MAX_CONDS_PER_METHOD = 400  # beyond this, nested branches are flattened (reported as a note)

_MODULE_BASES = {"torch.nn.Module", "torch.nn.modules.module.Module"}
_MODULE_HINTS = ("Module", "Model", "Layer", "Block", "Encoder", "Decoder", "Attention", "Embeddings",
                 "Head", "Net", "MLP", "Norm", "PreTrainedModel")
_TENSOR_TYPES = {"torch.nn.Parameter", "torch.nn.parameter.Parameter", "buffer"}


# ---------------------------------------------------------------------------------------------
# Source text helpers


class Source:
    def __init__(self, text: str, path: str) -> None:
        self.text = text
        self.path = path
        self.lines = text.splitlines(keepends=True)
        self._offsets: list[int] | None = None
        self._temps: set[str] | None = None
        self.positions: dict[int, Pos] = {}  # id(ast node) -> Pos; the tree outlives this Source
        self._unparsed: dict[int, str] = {}  # id(ast node) -> its text by ast.unparse
        # nodes extraction builds (an in-place fill's out-of-place form): held as long as the two
        # caches above, which an id freed and reused by another node would otherwise answer wrongly
        self.made: list[ast.AST] = []

    def temp_like_names(self) -> set[str]:
        """Identifiers of the file that look like our temporaries (`_t12`), to avoid them."""
        if self._temps is None:
            # the cheap search (a literal prefix) first: most files have no such name at all
            self._temps = set(_TEMP_LIKE.findall(self.text)) if _TEMP_PREFIX.search(self.text) else set()
        return self._temps

    def offsets(self) -> list[int]:
        if self._offsets is None:
            self._offsets = list(accumulate(map(len, self.lines), initial=0))
        return self._offsets

    def segment(self, node: ast.AST) -> str:
        """Source text of a node, whitespace-normalized to one line."""
        line, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        end_line, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
        if line == end_line:
            raw = _decode_slice(self.lines[line - 1], col, end_col)
        else:
            first = _decode_slice(self.lines[line - 1], col, None)
            middle = "".join(self.lines[line:end_line - 1])
            last = _decode_slice(self.lines[end_line - 1], 0, end_col)
            raw = first + middle + last
        if "\n" in raw or "  " in raw:
            if ("'" in raw or '"' in raw) and isinstance(node, ast.AST):
                # unparsing is slow and the same expression can be asked for again (inlined
                # helpers, loop texts): kept per node (the tree outlives this Source)
                found = self._unparsed.get(id(node))
                if found is not None:
                    return found
                try:
                    found = self._unparsed[id(node)] = ast.unparse(node)
                    return found
                except Exception:  # pragma: no cover - defensive
                    pass
            raw = " ".join(raw.split())
        return raw

    def raw(self, node: ast.AST) -> str:
        """Source text of a node exactly as written."""
        line, col = node.lineno, node.col_offset  # type: ignore[attr-defined]
        end_line, end_col = node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]
        if line == end_line:
            return _decode_slice(self.lines[line - 1], col, end_col)
        return (_decode_slice(self.lines[line - 1], col, None) + "".join(self.lines[line:end_line - 1])
                + _decode_slice(self.lines[end_line - 1], 0, end_col))

    def segment_at(self, pos: Pos) -> str:
        return self.segment(_Span(pos.line, pos.col, pos.end_line, pos.end_col))  # type: ignore[arg-type]

    def pos(self, node: ast.AST) -> Pos:
        found = self.positions.get(id(node))
        if found is None:
            found = self.positions[id(node)] = _new_pos(self.path, node.lineno, node.col_offset,  # type: ignore[attr-defined]
                                                          node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return found


class _Span:
    """A source range with an ast node's position attributes (for `Source.segment`)."""

    __slots__ = ("lineno", "col_offset", "end_lineno", "end_col_offset")

    def __init__(self, line: int, col: int, end_line: int, end_col: int) -> None:
        self.lineno, self.col_offset, self.end_lineno, self.end_col_offset = line, col, end_line, end_col


def _fast_constructor(cls: type, names: tuple[str, ...]):
    """A constructor for a frozen, slotted IR dataclass taking every field positionally, without
    the generic frozen `__init__` (which sets each field through `object.__setattr__` by name).
    Extraction builds hundreds of thousands of nodes; the result is the same object.

    The object is built as an instance of a private twin class with the same slots (plain
    attribute stores, no frozen `__setattr__`) whose `__init__` then turns it into `cls` by
    assigning `__class__` (allowed: the layouts are identical). Falls back to the class itself
    if its fields are not exactly `names` or the twin cannot be made."""
    slots = getattr(cls, "__slots__", None)
    if tuple(f.name for f in fields(cls)) != names or tuple(slots or ()) != names or cls.__bases__ != (object,):
        return cls
    params = ", ".join(f"_{i}" for i in range(len(names)))
    body = "".join(f"    self.{name} = _{i}\n" for i, name in enumerate(names))
    namespace: dict[str, object] = {"_cls": cls}
    # CPython compares the two classes' slot tuples on every `__class__` assignment, a comparison
    # that fails with TypeError ("layout differs") when it runs at the recursion limit; the layouts
    # were checked below, so that failure is the recursion limit and is reported as one
    exec(f"def __init__(self, {params}):\n{body}    try:\n        self.__class__ = _cls\n"  # noqa: S102
         "    except TypeError as exc:\n        raise RecursionError('too deep to build an IR object') from exc\n",
         namespace)
    twin = type(f"_{cls.__name__}Twin", (), {"__slots__": names, "__init__": namespace["__init__"]})
    try:
        probe = twin(*range(len(names)))
    except TypeError:  # pragma: no cover - a layout CPython will not swap
        return cls
    if type(probe) is not cls or tuple(getattr(probe, n) for n in names) != tuple(range(len(names))):
        return cls  # pragma: no cover
    return twin


_new_pos = _fast_constructor(Pos, ("file", "line", "col", "end_line", "end_col"))
_new_var = _fast_constructor(Var, ("name",))
_new_const = _fast_constructor(Const, ("value",))
_new_sym = _fast_constructor(Sym, ("text",))
_cond = _fast_constructor(Cond, ("id", "text", "taken"))
_seq = _fast_constructor(Seq, ("items", "kind"))
_param = _fast_constructor(Param, ("name", "default", "kind"))
_layer_def = _fast_constructor(LayerDef, ("attr", "type", "args", "kwargs", "items", "guard", "pos"))


class _Interned(dict):
    """SSA name -> its one Var: `_VARS[name]` looks up in C and builds a Var only when missing."""

    __slots__ = ()

    def __missing__(self, name: str) -> Var:
        found = self[name] = _new_var(name)
        return found


_VARS: dict[str, Var] = _Interned()  # one Var per SSA name of the file being extracted (cleared after it)


class _InternedSyms(dict):
    """Text -> its one Sym, as `_VARS` (a file repeats `config`, `self.num_heads`, `torch.long`)."""

    __slots__ = ()

    def __missing__(self, text: str) -> Sym:
        found = self[text] = _new_sym(text)
        return found


_SYMS: dict[str, Sym] = _InternedSyms()  # cleared after each file, as _VARS


class _InternedConsts(dict):
    """(type, value) -> its one Const: equal values of different types (1, 1.0, True) stay apart."""

    __slots__ = ()

    def __missing__(self, key: tuple[type, object]) -> Const:
        found = self[key] = _new_const(key[1])
        return found


_CONSTS: dict[tuple[type, object], Const] = _InternedConsts()  # cleared after each file, as _VARS


def _sym(text: str) -> Sym:
    return _SYMS[text]


def _const(value: Any) -> Const:
    """A Const of `value`; one object per file for each None, bool, int and str (most constants are
    None, 0, 1, -1 or an attribute name): the same value, fewer objects to make and free."""
    t = type(value)
    if value is None or t is int or t is str or t is bool:
        return _CONSTS[(t, value)]
    return _new_const(value)

_new_node = _fast_constructor(Node, ("kind", "op", "inputs", "kwargs", "outputs", "target", "guard", "pos", "via"))

_TEMP_LIKE = re.compile(r"\b_t\d+\b")
_TEMP_PREFIX = re.compile(r"_t\d")
_SOURCE: contextvars.ContextVar[Source] = contextvars.ContextVar("adopter_extract_source")


def _decode_slice(line: str, start: int, end: int | None) -> str:
    # ast columns are UTF-8 byte offsets
    if line.isascii():
        return line[start:end] if end is not None else line[start:]
    data = line.encode("utf-8")
    return (data[start:end] if end is not None else data[start:]).decode("utf-8", "replace")


# ---------------------------------------------------------------------------------------------
# Class discovery


@dataclass
class ClassInfo:
    node: ast.ClassDef
    bases: tuple[str, ...]
    methods: dict[str, ast.FunctionDef] = field(default_factory=dict)


def _is_module_class(info: ClassInfo, classes: dict[str, ClassInfo], seen: set[str] | None = None) -> bool:
    seen = seen or set()
    if info.node.name in seen:
        return False
    seen.add(info.node.name)
    if "forward" in info.methods:
        return True
    for base in info.bases:
        if base in _MODULE_BASES or base.startswith("torch.nn."):
            return True
        short = base.rpartition(".")[2]
        if short in classes and _is_module_class(classes[short], classes, seen):
            return True
        if short.endswith(_MODULE_HINTS):
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Extraction of one file


def extract_source(text: str, path: str = "<string>", module: str = "", package: Any = None) -> FileModel:
    """Extract the structure of every module class in `text`. A file that does not parse gives a
    FileModel with one error diagnostic and no classes. `package`: the repository's other files
    (engine.extract.package.PackageIndex), whose classes this file's classes may derive from."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        line = exc.lineno or 0
        return FileModel(path, module, (), (Diagnostic(path, line, f"does not parse: {exc.msg}", "error"),))
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        # the parser reports overflowing its own stack (thousands of nested lambdas) as MemoryError
        why = str(exc) if not isinstance(exc, MemoryError) else "nested too deeply for the parser's stack"
        return FileModel(path, module, (), (Diagnostic(path, 0, f"does not parse: {why}", "error"),))
    return extract_tree(tree, text, path, module, package)


def extract_tree(tree: ast.Module, text: str, path: str = "<string>", module: str = "", package: Any = None) -> FileModel:
    """`extract_source` of `text` whose `ast` parse `tree` the caller has made already (a scan
    parses a file once for extraction and the steps after it). The tree is read, never changed."""
    src = Source(text, path)
    token = _SOURCE.set(src)
    # Extraction allocates many small objects and frees none: the cyclic collector would only
    # rescan them (about a tenth of the time), so it is paused for the file.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _FileExtractor(tree, src, module, path.endswith("__init__.py"), package).run()
    finally:
        _VARS.clear()
        _SYMS.clear()
        _CONSTS.clear()
        if gc_was_enabled:
            gc.enable()
        _SOURCE.reset(token)


def class_layers(tree: ast.Module, text: str, path: str, module: str, name: str,
                 package: Any) -> tuple[LayerDef, ...] | None:
    """The layers that the `__init__`s of the class `name` of this file and of its bases build: what
    a subclass in another file of the repository inherits (engine.extract.package). None where the
    file defines no such class."""
    src = Source(text, path)
    token = _SOURCE.set(src)
    try:
        fx = _FileExtractor(tree, src, module, path.endswith("__init__.py"), package)
        if name not in fx.classes:
            return None
        return tuple(fx.chain_layers(fx.mro(name)))
    finally:
        _SOURCE.reset(token)


def class_model(tree: ast.Module, text: str, path: str, module: str, name: str, package: Any) -> ClassModel | None:
    """The extracted class `name` of this file (its layers and methods) alone, for facts about what
    a call of one of its instances returns (engine.analysis.shapes); None where the file defines no
    module class of that name or it cannot be extracted."""
    src = Source(text, path)
    token = _SOURCE.set(src)
    try:
        fx = _FileExtractor(tree, src, module, path.endswith("__init__.py"), package)
        info = fx.classes.get(name)
        if info is None or not _is_module_class(info, fx.classes):
            return None
        return fx.extract_class(name, info)
    except RecursionError:
        return None
    finally:
        _SOURCE.reset(token)


def extract_file(path: str | Path, *, module: str | None = None, display_path: str | None = None) -> FileModel:
    """Extract one file. `module` defaults to the dotted name found from the package layout;
    `display_path` (default: the path as given) is what positions and diagnostics name."""
    p = Path(path)
    shown = display_path if display_path is not None else str(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        return FileModel(shown, module or "", (), (Diagnostic(shown, 0, f"cannot read: {exc.strerror}", "error"),))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return FileModel(shown, module or "", (), (Diagnostic(shown, 0, f"not UTF-8 text: {exc.reason}", "error"),))
    if module is None:
        module = module_name_for(p)
    return extract_source(text, shown, module)


def iter_python_files(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    skip = {".git", ".venv", "venv", "node_modules", "__pycache__", ".tox", "build", "dist", ".eggs"}
    out: list[Path] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if any(part in skip or part.startswith(".") for part in rel[:-1]):
            continue
        out.append(path)
    return out


def extract_path(path: str | Path) -> list[FileModel]:
    """Extract every Python file in a file or folder (recursively, skipping virtual envs and VCS
    folders). Positions name files relative to the folder."""
    root = Path(path)
    if root.is_file():
        return [extract_file(root)]
    return [extract_file(p, display_path=p.relative_to(root).as_posix()) for p in iter_python_files(root)]


class _FileExtractor:
    def __init__(self, tree: ast.Module, src: Source, module: str, is_package: bool, package: Any = None) -> None:
        self.tree = tree
        self.src = src
        self.module = module
        self.package = package  # engine.extract.package.PackageIndex: bases from the repository's other files
        self.imports = Imports(tree, module, is_package)
        self.functions: dict[str, ast.FunctionDef] = {}
        self.classes: dict[str, ClassInfo] = {}  # by name: the last class of a name, as code after it sees
        self.defined: list[ClassInfo] = []  # every class in order, a shadowed one of a reused name too
        self.diagnostics: list[Diagnostic] = []
        self._generators: dict[int, bool] = {}
        self._init_layers: dict[int, tuple[LayerDef, ...]] = {}  # id(__init__) -> its layers (the tree outlives this)
        self.tensor_attrs_cache: dict[int, tuple[dict[str, list[LayerDef]], frozenset[str]]] = {}
        self.state_attrs_cache: dict[int, frozenset[str]] = {}  # id(class node) -> `_state_attrs` of its chain
        self.method_state_attrs: dict[int, frozenset[str]] = {}  # id(method) -> the state attributes it sets
        self._stateless_forwards: dict[str, list[ClassInfo]] = {}  # class -> stateless_forward's owners
        self._other_files: dict[str, _FileExtractor | None] = {}  # a file of the repository -> its extractor
        self.function_defs: list[ast.FunctionDef] = []  # every module-level def, a shadowed one too
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef):
                self.functions[stmt.name] = stmt
                self.function_defs.append(stmt)
                continue
            # a call of a module-level function runs what its name is bound to last (calls in
            # functions run after the module is loaded): another binding of the name after its `def`
            # (an assignment, an import, a class) leaves no def to inline, unless it wraps that very
            # function (`rms_norm = compile(rms_norm)`), as a decorator would
            for bound in _bound_names(stmt):
                if bound in self.functions and not _wraps_itself(stmt, bound):
                    del self.functions[bound]
            if isinstance(stmt, ast.ClassDef):
                bases = tuple(_qualify(self.imports.names, b) or self.src.segment(b) for b in stmt.bases)
                info = ClassInfo(stmt, bases)
                for item in stmt.body:
                    if isinstance(item, ast.FunctionDef):
                        info.methods[item.name] = item
                self.classes[stmt.name] = info
                self.defined.append(info)

    def init_layers(self, init: ast.FunctionDef) -> tuple[LayerDef, ...]:
        """The layers an `__init__` of this file builds; a base class's `__init__` is read once for
        all its subclasses (the result depends on the function and the file only)."""
        found = self._init_layers.get(id(init))
        if found is None:
            found = self._init_layers[id(init)] = tuple(_InitExtractor(self, init).run())
        return found

    def is_generator(self, fn: ast.FunctionDef) -> bool:
        known = self._generators.get(id(fn))
        if known is None:
            text = self.src.raw(fn)
            known = "yield" in text and any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn))
            self._generators[id(fn)] = known
        return known

    def mro(self, name: str | ClassInfo) -> list[ClassInfo]:
        """The class (by name, or itself: a class shadowed by a later one of its name) and its bases
        defined in this file, nearest first."""
        out: list[ClassInfo] = []
        todo: list[str | ClassInfo] = [name]
        while todo:
            current = todo.pop(0)
            info = current if isinstance(current, ClassInfo) else self.classes.get(current)
            if info is None or info in out:
                continue
            out.append(info)
            for base in info.bases:
                short = base.rpartition(".")[2]
                if base == f"{self.module}.{short}" or base == short:
                    todo.append(short)
        return out

    def other_file(self, rel: str) -> _FileExtractor | None:
        """The extractor of another file of the repository (engine.extract.package), made once."""
        if rel in self._other_files:
            return self._other_files[rel]
        found = self.package.source(rel) if self.package is not None else None
        fx = None
        if found is not None:
            fx = _FileExtractor(found[1], Source(found[0], rel), self.package.module_of(rel), rel.endswith("__init__.py"),
                                self.package)
        self._other_files[rel] = fx
        return fx

    def inherited_method(self, chain: list[ClassInfo], name: str, hops: int = 0) -> tuple[ast.FunctionDef, _FileExtractor] | None:
        """The method `name` that the class whose MRO of this file's classes is `chain` inherits
        from a base class defined in another file of the repository (labml's `AlibiMultiHeadAttention`
        calls `self.get_scores`, which `MultiHeadAttention` of `transformers/mha.py` defines), with
        the extractor of the file that holds it. Only along single inheritance, where the method
        resolution order is the chain of bases, and only where no class on the way binds the name
        otherwise than by a `def` (a class attribute); None elsewhere."""
        if self.package is None or not chain or hops >= MAX_BASE_FILES:
            return None
        if any(len(k.node.bases) != 1 or k.node.keywords or _binds_otherwise(k, name) for k in chain):
            return None
        top = chain[-1]
        base = top.bases[0]
        short = base.rpartition(".")[2]
        if base in (short, f"{self.module}.{short}") or base.startswith("torch.") or base in _MODULE_BASES:
            return None
        where = self.package.resolve(self.src.path, self.tree, top.node.bases[0])
        fx = self.other_file(where[0]) if where is not None else None
        if fx is None or where is None or where[1] not in fx.classes:
            return None
        other = fx.mro(where[1])
        for klass in other:
            fn = klass.methods.get(name)
            if fn is not None:
                return None if _binds_otherwise(klass, name) else (fn, fx)
        return fx.inherited_method(other, name, hops + 1)

    def stateless_forward(self, layer: LayerDef, target: str, chain: list[ClassInfo]) -> list[ClassInfo]:
        """For a submodule of the class whose MRO is `chain`, built once, unconditionally, in
        `__init__` from a class of this file, and assigned nowhere else by that class, its bases or
        its subclasses in the file: the classes of its MRO whose `forward`s its call runs (its own,
        then those reached by `super().forward(...)`), when none of them reads `self` (a scorer
        computing `a @ b.transpose(-1, -2)` from its arguments alone); else nothing."""
        short = layer.type.rpartition(".")[2]
        if layer.guard or layer.items or layer.type not in (short, f"{self.module}.{short}") \
                or short not in self.classes or target.count(".") != 1:
            return []
        owners = self._stateless_forwards.get(short)
        if owners is None:
            owners = self._stateless_forwards[short] = self._forwards_reading_no_state(short)
        if not owners:
            return []
        attr = target.partition(".")[2]
        related = [info for name, info in self.classes.items()
                   if info in chain or any(base in chain for base in self.mro(name))]
        stores = [n for info in related for fn in info.methods.values() for n in _walk(fn)
                  if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr == attr
                  and isinstance(n.value, ast.Name) and n.value.id == "self"]
        return owners if len(stores) == 1 else []

    def _forwards_reading_no_state(self, name: str) -> list[ClassInfo]:
        """The classes whose `forward`s a call of a `name` module runs, along its single-inheritance
        chain of this file's classes down to `nn.Module`, when none of them reads its `self` and none
        defines `__call__`; else nothing."""
        owners: list[ClassInfo] = []
        info = self.classes.get(name)
        reaching = True  # the next forward found is the one that runs
        while info is not None:
            if "__call__" in info.methods or len(info.bases) != 1:
                return []
            fn = info.methods.get("forward")
            if fn is not None and reaching:
                if fn.decorator_list or not fn.args.args:
                    return []
                owners.append(info)
                me = fn.args.args[0].arg
                reaching = False
                todo: list[ast.AST] = [fn]
                for n in todo:  # breadth first, as ast.walk (not compiled), up to the first read of `self`
                    if isinstance(n, ast.Name) and n.id == me:
                        return []
                    if isinstance(n, ast.Call) and _is_bare_super(n):
                        reaching = True
                    _add_children(n, todo)
            base = info.bases[0]
            if base in _MODULE_BASES:
                return [] if reaching else owners  # a super().forward(...) reaching nn.Module's raises
            short = base.rpartition(".")[2]
            info = self.classes.get(short) if base in (short, f"{self.module}.{short}") else None
        return []

    def run(self) -> FileModel:
        classes: list[ClassModel] = []
        for info in self.defined:
            name = info.node.name
            if not _is_module_class(info, self.classes):
                continue
            try:
                classes.append(self.extract_class(name, info))
            except RecursionError:
                self.diagnostics.append(Diagnostic(self.src.path, info.node.lineno,
                                                   f"class {name}: nesting too deep to extract"))
        module_level = self.extract_module_level()
        if module_level is not None:
            classes.append(module_level)
        return FileModel(self.src.path, self.module, tuple(classes), tuple(self.diagnostics))

    def extract_module_level(self) -> ClassModel | None:
        """Module-level functions and top-level statements (training scripts, activation helpers),
        as the methods of a pseudo-class `__module__`; top-level code is the method `__toplevel__`."""
        methods: list[Method] = []
        for fn in self.function_defs:  # each def is a function of its own, a redefined one too
            if _is_scripted(fn):
                continue  # compiled on its own (a kernel there would have to be scriptable): its calls are the sites
            methods.append(_MethodExtractor(self, [], {}, fn).run())
        # methods of classes that are not modules (a Trainer building the optimizer, a sampler), as
        # functions named `Class.method`: no layers of their own, but what they call still matches
        for name, info in self.classes.items():
            if _is_module_class(info, self.classes):
                continue
            for fn in info.methods.values():
                if any(_calls_something(stmt) for stmt in fn.body):
                    method = _MethodExtractor(self, [], {}, fn).run()
                    methods.append(Method(f"{name}.{method.name}", method.params, method.nodes, method.pos,
                                          method.notes))
        body = [stmt for stmt in self.tree.body
                if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))
                and not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))]
        if any(isinstance(stmt, (ast.If, ast.For, ast.With, ast.Expr, ast.Assign, ast.AugAssign, ast.While, ast.Try))
               and _calls_something(stmt) for stmt in body):
            first, last = body[0], body[-1]
            toplevel = ast.FunctionDef(name=TOPLEVEL, args=ast.arguments([], [], None, [], [], None, []), body=body,
                                       decorator_list=[], returns=None, type_comment=None)
            toplevel.lineno, toplevel.col_offset = first.lineno, first.col_offset
            toplevel.end_lineno, toplevel.end_col_offset = last.end_lineno, last.end_col_offset
            methods.append(_MethodExtractor(self, [], {}, toplevel).run())
        if not methods:
            return None
        return ClassModel(MODULE_CLASS, (), (), tuple(methods), None)

    # -- classes ---------------------------------------------------------------------------

    def chain_layers(self, chain: list[ClassInfo]) -> list[LayerDef]:
        """The layers the `__init__`s of the classes of `chain` (an MRO of this file's classes) build,
        base classes' first: a base defined in another file of the repository before the class
        deriving from it."""
        layers: list[LayerDef] = []
        for klass in reversed(chain):
            if self.package is not None:
                for expr, base in zip(klass.node.bases, klass.bases, strict=True):
                    short = base.rpartition(".")[2]
                    if base not in (short, f"{self.module}.{short}") and not base.startswith("torch."):
                        layers.extend(self.package.base_layers(self.src.path, self.tree, expr))
            init = klass.methods.get("__init__")
            if init is not None:
                layers.extend(self.init_layers(init))
        return layers

    def extract_class(self, name: str, info: ClassInfo) -> ClassModel:
        chain = self.mro(info)
        # layers built by base classes' __init__ first, then this class's own
        layers = self.chain_layers(chain)
        if any(layer.type == "?" for layer in layers):  # the text search only where it can drop one
            called = _called_self_attrs(info.node, self.src)
            layers = [layer for layer in layers if layer.type != "?" or layer.attr in called]
        table: dict[str, list[LayerDef]] = {}
        for layer in layers:
            table.setdefault(layer.attr, []).append(layer)
        methods: list[Method] = []
        for method_name, fn in info.methods.items():
            if method_name == "__init__" and not _builds_optimizer(self.init_layers(fn)) or _is_static_helper(fn):
                continue
            methods.append(_MethodExtractor(self, chain, table, fn).run())
        return ClassModel(name, info.bases, tuple(layers), tuple(methods), self.src.pos(info.node))


_COLLECTING = ("append", "extend", "insert")


def _constructs(func: ast.expr) -> bool:
    """A call of `func` builds an object of a class, by the convention that classes are capitalized
    (tensor constructors, `torch.LongTensor(...)`, excepted)."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name[:1].isupper() and not name.endswith("Tensor")


def _computed(value: ast.AST | None, local: set[str]) -> bool:
    """`value` reads a name of the function (`local`), and is no object built (`KVCache(batch_size, ...)`)."""
    if value is None or isinstance(value, ast.Call) and _constructs(value.func):
        return False
    return any(isinstance(n, _Name) and n.id in local for n in _walk(value))


def _state_attrs(chain: list[ClassInfo], cache: dict[int, frozenset[str]], src: Source) -> frozenset[str]:
    """`self.X` attributes that a method other than `__init__` sets to a value computed from its own
    parameters or locals (`self.item_embeddings = self.entity_embedding(item)`), or to a list it
    fills with such values (`self.h_emb_list.append(self.entity_embedding(head))`): state the module
    computes at run time and reads back in its methods, data as a local is. An attribute only ever
    set from other attributes and constants (`self.step += 1`, `self.scale = self.dim ** -0.5`), or
    to an object built there (`self.kv_cache = KVCache(batch_size, ...)`), is not. Each method is
    read once per file (`cache`: id(method) -> its attributes), however many subclasses share it."""
    found: set[str] = set()
    for info in chain:
        for name, fn in info.methods.items():
            if name == "__init__" or not fn.args.args:
                continue
            attrs = cache.get(id(fn))
            if attrs is None:
                attrs = cache[id(fn)] = _method_state_attrs(fn, src.raw(fn))
            found |= attrs
    return frozenset(found)


def _method_state_attrs(fn: ast.FunctionDef, text: str) -> frozenset[str]:
    """The `self.X` attributes of `_state_attrs` that one method (its source `text`) sets."""
    this = fn.args.args[0].arg
    # most methods set no attribute of `this` and call no `append`: their statements (a small part
    # of their nodes) and their text tell, without walking every expression
    if text.isascii() and not any(word in text for word in _COLLECTING) \
            and not any(_assigns_attr(stmt, this) for stmt in _statements(fn)):
        return frozenset()
    args = fn.args
    nodes = _walk(fn)
    local = {a.arg for a in (*args.posonlyargs, *args.args[1:], *args.kwonlyargs)}
    local |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    local |= {n.id for n in nodes if isinstance(n, _Name) and isinstance(n.ctx, ast.Store)}
    local.discard(this)
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and _assigns_attr(node, this) \
                and _computed(node.value, local):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for item in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                    if isinstance(item, _Attribute) and isinstance(item.value, _Name) and item.value.id == this:
                        found.add(f"self.{item.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, _Attribute) and node.func.attr in _COLLECTING \
                and isinstance(node.func.value, _Attribute) and isinstance(node.func.value.value, _Name) \
                and node.func.value.value.id == this and any(_computed(a, local) for a in node.args):
            found.add(f"self.{node.func.value.attr}")
    return frozenset(found)


def _statements(fn: ast.FunctionDef) -> list[ast.AST]:
    """`fn` and every statement under it (nested functions' and classes' included), with the
    except handlers and match cases between them: no expression holds a statement."""
    todo: list[ast.AST] = [fn]
    for node in todo:  # grows while it is walked
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, _BLOCK_ITEMS):
                        todo.append(item)
    return todo


def _assigns_attr(node: ast.AST, this: str) -> bool:
    """`node` is an assignment to an attribute of `this` (`this.x = ...`, `this.a, this.b = ...`, `this.n += 1`)."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    else:
        return False
    return any(isinstance(item, _Attribute) and isinstance(item.value, _Name) and item.value.id == this
               for target in targets for item in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]))


def _called_self_attrs(node: ast.ClassDef, src: Source) -> set[str]:
    """`self.X` attributes that the class's source calls (`self.X(`), found by text for speed."""
    start = src.offsets()[node.lineno - 1]
    end = src.offsets()[min(node.end_lineno or node.lineno, len(src.lines))]
    return {f"self.{m}" for m in re.findall(r"self\.(\w+)\s*\(", src.text[start:end])}


def _builds_optimizer(layers: tuple[LayerDef, ...]) -> bool:
    """Whether an `__init__` stores an optimizer (`self.optimizer = optim.Adam(self.parameters())`):
    not a layer but a call the rules rewrite, so the `__init__` is extracted as a method too."""
    return any(layer.type.startswith("torch.optim.") for layer in layers)


def _is_static_helper(fn: ast.FunctionDef) -> bool:
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Name) and dec.id in ("property", "staticmethod", "classmethod"):
            return dec.id == "property"
    return False


# ---------------------------------------------------------------------------------------------
# __init__: the layer table


class _InitExtractor:
    def __init__(self, fx: _FileExtractor, fn: ast.FunctionDef) -> None:
        self.fx = fx
        self.fn = fn
        self.cond_id = 0
        self.layers: list[LayerDef] = []
        self.local_layers: dict[str, LayerDef] = {}  # local name -> layer built into it
        # the methods of the class whose `__init__` this is: `self.act = self.gelu` stores one of them
        self.methods = next((set(info.methods) for info in fx.classes.values() if info.methods.get("__init__") is fn),
                            set())

    def run(self) -> list[LayerDef]:
        self.block(self.fn.body, ())
        return self.layers

    def block(self, body: list[ast.stmt], guard: tuple[Cond, ...]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assign):
                for target in stmt.targets:
                    self.assign(target, stmt.value, guard, stmt)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self.assign(stmt.target, stmt.value, guard, stmt)
            elif isinstance(stmt, ast.If):
                cid = self.cond_id
                self.cond_id += 1
                text = self.fx.src.segment(stmt.test)
                self.block(stmt.body, (*guard, _cond(cid, text, True)))
                self.block(stmt.orelse, (*guard, _cond(cid, text, False)))
            elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
                self.block(stmt.body, guard)
                if isinstance(stmt, ast.Try):
                    for handler in stmt.handlers:
                        self.block(handler.body, guard)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                self.call_statement(stmt.value, guard)

    def call_statement(self, call: ast.Call, guard: tuple[Cond, ...]) -> None:
        # self.layers.append(nn.Linear(...)) / self.add_module("name", nn.Linear(...))
        func = call.func
        if not isinstance(func, ast.Attribute):
            return
        owner = _self_attr(func.value)
        if func.attr == "append" and owner and call.args:
            item = self.layer(f"{owner}[*]", call.args[0], guard, call)
            if item is not None:
                self.layers.append(item)
        elif func.attr == "register_buffer" and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and len(call.args) >= 2 and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
            self.layers.append(_layer_def(f"self.{call.args[0].value}", "buffer", (), (), (), guard, self.fx.src.pos(call)))
        elif func.attr == "add_module" and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and len(call.args) >= 2 and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
            item = self.layer(f"self.{call.args[0].value}", call.args[1], guard, call)
            if item is not None:
                self.layers.append(item)

    def assign(self, target: ast.expr, value: ast.expr, guard: tuple[Cond, ...], stmt: ast.stmt) -> None:
        attr = _self_attr(target)
        if attr is None:
            if isinstance(target, ast.Name):
                built = self.layer(target.id, value, guard, stmt)
                if built is not None and built.type != "?":
                    self.local_layers[target.id] = built
                else:
                    self.local_layers.pop(target.id, None)
            return
        built = self.layer(attr, value, guard, stmt)
        if built is not None:
            self.layers.append(built)

    def layer(self, attr: str, value: ast.expr, guard: tuple[Cond, ...], at: ast.AST) -> LayerDef | None:
        """A LayerDef for `attr = value`, or None when `value` builds no module."""
        fx = self.fx
        pos = fx.src.pos(at)
        if isinstance(value, ast.Call):
            callee = _qualify(fx.imports.names, value.func)
            if callee is not None and _not_a_module(callee):
                return None
            if callee is None:
                if isinstance(value.func, ast.Subscript):  # ACT2FN["gelu"](...) style
                    callee = self.subscript_type(value.func)
                if callee is None:
                    return None
            args = tuple(self.operand(a) for a in value.args)
            kwargs = tuple((k.arg or "**", self.operand(k.value)) for k in value.keywords)
            items: tuple[LayerDef, ...] = ()
            if callee in ("torch.nn.ModuleList", "torch.nn.Sequential") and value.args:
                items = self.container_items(attr, value.args if callee == "torch.nn.Sequential" else value.args[:1],
                                             guard, callee)
                args = () if items else args
            return _layer_def(attr, callee, args, kwargs, items, guard, pos)
        if isinstance(value, ast.Subscript):
            kind = self.subscript_type(value)
            if kind is not None:
                return _layer_def(attr, kind, (), (), (), guard, pos)
            return None
        if isinstance(value, ast.Name) and value.id in self.local_layers:
            local = self.local_layers[value.id]
            return _layer_def(attr, local.type, local.args, local.kwargs, local.items, guard, pos)
        other = _self_attr(value)
        if other is not None:
            # attribute assigned from another attribute: the same module under two names
            for previous in reversed(self.layers):
                if previous.attr == other:
                    return _layer_def(attr, previous.type, previous.args, previous.kwargs, previous.items, guard, pos)
            if other[5:] in self.methods:
                # a bound method of the class stored as the callable (`self.act = self.gelu`): its
                # calls run that method, which the training step then reads (matcher.training_methods)
                return _layer_def(attr, other, (), (), (), guard, pos)
            return None
        if isinstance(value, ast.Attribute) and _mentions_config(value):
            # a module chosen by configuration (`self.act = config.hidden_act`): type unknown
            return _layer_def(attr, "?", (_sym(fx.src.segment(value)),), (), (), guard, pos)
        return None

    def subscript_type(self, value: ast.Subscript) -> str | None:
        base = _qualify(self.fx.imports.names, value.value)
        if base is None:
            return None
        short = base.rpartition(".")[2]
        if short.isupper() or short.endswith(("FN", "2FN", "_MAP", "CLASSES")):  # activation tables
            return f"{base}[{self.fx.src.segment(value.slice)}]"
        return None

    def container_items(self, attr: str, args: list[ast.expr], guard: tuple[Cond, ...],
                        callee: str) -> tuple[LayerDef, ...]:
        items: list[LayerDef] = []
        elements: list[ast.expr] = []
        repeated = False
        for arg in args:
            if isinstance(arg, (ast.List, ast.Tuple)):
                elements.extend(arg.elts)
            elif isinstance(arg, (ast.ListComp, ast.GeneratorExp)):
                elements.append(arg.elt)
                repeated = True
            elif isinstance(arg, ast.Starred):
                return ()
            else:
                elements.append(arg)
        for i, element in enumerate(elements):
            sub = self.layer(f"{attr}[*]" if repeated else f"{attr}[{i}]", element, guard, element)
            if sub is None:
                return ()
            items.append(sub)
        return tuple(items)

    def operand(self, expr: ast.expr) -> Operand:
        return _const_or_sym(expr, self.fx.src)


_NOT_MODULES = {"int", "float", "str", "bool", "tuple", "list", "dict", "set", "len", "max", "min", "round",
                "getattr", "range", "sum", "abs", "isinstance", "super", "frozenset", "sorted", "type"}


def _not_a_module(callee: str) -> bool:
    """Constructions that build plain Python values (builtins, math). Parameters and tensors
    (`nn.Parameter`, `torch.zeros`) stay in the table: they tell a tensor from a number."""
    return callee in _NOT_MODULES or callee.startswith(("math.", "numpy.", "np."))


def _self_attr(expr: ast.expr) -> str | None:
    if type(expr) is ast.Attribute and type(expr.value) is ast.Name and expr.value.id == "self":  # type: ignore[attr-defined]
        return f"self.{expr.attr}"
    return None


def _mentions_config(expr: ast.expr) -> bool:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return isinstance(expr, ast.Name) and "config" in expr.id


def _const_or_sym(expr: ast.expr, src: Source) -> Operand:
    value = _literal(expr)
    if value is not _NOT_LITERAL:
        return _const(value)
    return _sym(src.segment(expr))


_NOT_LITERAL = object()


def _literal(expr: Any) -> object:
    t = type(expr)
    if t is ast.Constant:
        value = expr.value
        if isinstance(value, (int, float, str, bool)) or value is None or value is Ellipsis:
            if isinstance(value, float) and value != value:  # NaN never equals itself
                return _NOT_LITERAL
            return value
        return _NOT_LITERAL
    if t is ast.UnaryOp and type(expr.op) is ast.USub and type(expr.operand) is ast.Constant:  # type: ignore[attr-defined]
        value = expr.operand.value  # type: ignore[attr-defined]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
        return _NOT_LITERAL
    if t is ast.Tuple:
        items = tuple([_literal(e) for e in expr.elts])  # type: ignore[attr-defined]
        if any(i is _NOT_LITERAL for i in items):
            return _NOT_LITERAL
        return items
    return _NOT_LITERAL


# ---------------------------------------------------------------------------------------------
# Methods: DL nodes, data flow, control flow, inlining


class _Scope:
    """Name bindings inside one (possibly inlined) function body."""

    def __init__(self, env: dict[str, str], layers: dict[str, str], self_class: list[ClassInfo] | None,
                 tensors: frozenset[str] = frozenset()) -> None:
        self.env = env  # python name -> current SSA name
        self.layers = layers  # python name -> layer target (for `layer = self.layers[i]`)
        self.tensors = tensors  # `self.X` attributes holding tensors (parameters, buffers)
        self.self_class = self_class  # MRO when `self` is the module, None in a plain function
        self.returns: list[tuple[Operand, tuple[Cond, ...]]] = []


class _Terminated(Exception):
    """The block always leaves: by `return` (raised=False) or by `raise` (raised=True)."""

    def __init__(self, raised: bool = False) -> None:
        super().__init__()
        self.raised = raised


class _MethodExtractor:
    def __init__(self, fx: _FileExtractor, chain: list[ClassInfo], table: dict[str, list[LayerDef]],
                 fn: ast.FunctionDef) -> None:
        self.fx = fx
        self.src = fx.src
        self.root_fx = fx  # the file of the class extracted (`fx` is the file of the code being read)
        self.owners: dict[int, _FileExtractor] = {}  # id(method found for `self.name(...)`) -> its file, where
        # that is not the file of the code calling it (inherited from another file, or called back from there)
        self.chain = chain
        self.table = table
        self.fn = fn
        self.nodes: list[Node] = []
        self.notes: list[str] = []
        self.versions: dict[str, int] = {}
        self.kinds: dict[str, str] = {}  # SSA name -> "scalar" when known to be a Python number
        self.cond_count = 0
        self.temp_count = 0
        self.via: tuple[Pos, ...] = ()
        self.inline_stack: list[str] = []
        self.caller_envs: list[dict[str, str]] = []  # the callers' name bindings at each inlined call
        self.inline_consts: dict[str, str] = {}  # inlined parameters bound to a constant -> its text
        self.super_owners: list[list[ClassInfo]] = []  # per inlined submodule forward: what super() reaches
        self.generated: set[str] = set()  # temporaries and merge results made up by extraction
        self.filled_in_place: dict[str, str] = {}  # a tensor's value after an in-place fill -> before it
        self.avoid_temps = fx.src.temp_like_names()
        self.positions = fx.src.positions

    # -- names ------------------------------------------------------------------------------

    def fresh(self, base: str) -> str:
        n = self.versions.get(base)
        if n is None:
            self.versions[base] = 0
            return base
        self.versions[base] = n + 1
        return f"{base}.{n + 1}"

    def temp(self) -> str:
        while True:
            self.temp_count += 1
            name = f"_t{self.temp_count}"
            if name not in self.avoid_temps:
                self.generated.add(name)
                return name

    def new_cond(self, test: ast.expr | None, text: str | None = None) -> int:
        cid = self.cond_count
        self.cond_count += 1
        return cid

    def caller_text(self, test: ast.expr, scope: _Scope, text: str) -> str:
        """A condition of an inlined helper, written in its caller's terms: each of its names is
        the caller's variable holding the same value at the call (the helper's parameter
        `head_mask` is the caller's `layer_head_mask` passed to it), or a global the caller does not
        shadow. One that reads a value with no name in the caller (a helper's local) is marked
        HELPER_CONDITION: no guard at the call can state it."""
        if not self.caller_envs:
            return text
        caller = self.caller_envs[-1]
        renames: dict[str, str] = {}
        for node in _walk(test):
            if isinstance(node, (ast.Lambda, ast.comprehension)):
                return HELPER_CONDITION + text
            if not isinstance(node, ast.Name) or node.id == "self":
                continue
            ssa = scope.env.get(node.id)
            if ssa is None:
                if node.id in caller:
                    return HELPER_CONDITION + text  # a global of the helper, a local of the caller
                continue
            constant = self.inline_consts.get(ssa)
            if constant is not None:
                renames[node.id] = constant
                continue
            name = ssa.split(".", 1)[0]
            if caller.get(name) != ssa:
                return HELPER_CONDITION + text
            renames[node.id] = name
        if all(old == new for old, new in renames.items()):
            return text
        return _renamed(text, test, renames)

    def tensor_attrs(self) -> frozenset[str]:
        # the same for every method of a class: kept with the table (which the cache holds on to,
        # so that its id is not reused)
        cached = self.fx.tensor_attrs_cache.get(id(self.table))
        if cached is not None and cached[0] is self.table:
            return cached[1]
        found = frozenset(attr for attr, defs in self.table.items()
                          if any(d.type in _TENSOR_TYPES or d.type.startswith("torch.") and d.type.rpartition(".")[2][:1].islower()
                                 for d in defs))
        key = id(self.chain[0].node) if self.chain else 0
        state = self.fx.state_attrs_cache.get(key)
        if state is None:
            state = self.fx.state_attrs_cache[key] = _state_attrs(self.chain, self.fx.method_state_attrs, self.src)
        found |= {attr for attr in state if attr not in self.table}
        self.fx.tensor_attrs_cache[id(self.table)] = (self.table, found)
        return found

    # -- entry ------------------------------------------------------------------------------

    def run(self) -> Method:
        fn = self.fn
        params, env = self.bind_params(fn, skip_self=True)
        scope = _Scope(env, {}, self.chain, self.tensor_attrs())
        try:
            self.block(fn.body, scope, ())
        except _Terminated:
            pass
        except RecursionError:
            self.notes.append("expression nesting too deep; extraction stopped")
        return Method(fn.name, params, tuple(self.nodes), self.src.pos(fn), tuple(self.notes))

    def bind_params(self, fn: ast.FunctionDef, skip_self: bool) -> tuple[tuple[Param, ...], dict[str, str]]:
        args = fn.args
        params: list[Param] = []
        env: dict[str, str] = {}
        positional = [*args.posonlyargs, *args.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
            if i == 0 and skip_self and arg.arg in ("self", "cls"):
                continue
            params.append(_param(arg.arg, _const_or_sym(default, self.src) if default is not None else None, "normal"))
            env[arg.arg] = self.fresh(arg.arg)
            if default is not None and isinstance(_literal(default), (int, float)) and not isinstance(_literal(default), bool):
                self.kinds[env[arg.arg]] = "scalar"
        if args.vararg:
            params.append(_param(args.vararg.arg, None, "vararg"))
            env[args.vararg.arg] = self.fresh(args.vararg.arg)
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
            params.append(_param(arg.arg, _const_or_sym(default, self.src) if default is not None else None, "kwonly"))
            env[arg.arg] = self.fresh(arg.arg)
        if args.kwarg:
            params.append(_param(args.kwarg.arg, None, "varkw"))
            env[args.kwarg.arg] = self.fresh(args.kwarg.arg)
        return tuple(params), env

    # -- emitting ----------------------------------------------------------------------------

    def emit(self, kind: str, op: str, inputs: tuple[Operand, ...], kwargs: tuple[tuple[str, Operand], ...],
             guard: tuple[Cond, ...], at: ast.AST, target: str | None = None, n_out: int = 1,
             outputs: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if outputs is None:
            if n_out == 1:
                # self.temp(), inlined: this runs for most nodes
                self.temp_count += 1
                name = f"_t{self.temp_count}"
                if name in self.avoid_temps:
                    name = self.temp()
                else:
                    self.generated.add(name)
                outputs = (name,)
            else:
                outputs = tuple(self.temp() for _ in range(n_out))
        positions = self.positions
        key = id(at)
        pos = positions.get(key)
        if pos is None:  # Source.pos, inlined: most nodes are at a place of their own
            pos = positions[key] = _new_pos(self.src.path, at.lineno, at.col_offset,  # type: ignore[attr-defined]
                                            at.end_lineno, at.end_col_offset)  # type: ignore[attr-defined]
        self.nodes.append(_new_node(kind, op, inputs, kwargs, outputs, target, guard, pos, self.via))
        return outputs

    # -- statements --------------------------------------------------------------------------

    def block(self, body: list[ast.stmt], scope: _Scope, guard: tuple[Cond, ...]) -> tuple[Cond, ...]:
        """Extract a statement list. Returns the guard in force after it (an `if` whose branch
        returns narrows the rest of the block to the other branch). Raises _Terminated when the
        block always leaves (return/raise on every path)."""
        for stmt in body:
            guard = self.statement(stmt, scope, guard)
        return guard

    def statement(self, stmt: Any, scope: _Scope, guard: tuple[Cond, ...]) -> tuple[Cond, ...]:
        t = type(stmt)
        if t is ast.Assign:
            value = self.expr(stmt.value, scope, guard)
            for target in stmt.targets:
                self.bind(target, value, stmt.value, scope, guard, stmt)
        elif t is ast.AnnAssign:
            if stmt.value is not None:
                value = self.expr(stmt.value, scope, guard)
                self.bind(stmt.target, value, stmt.value, scope, guard, stmt)
        elif t is ast.AugAssign:
            current = self.expr(stmt.target, scope, guard)
            right = self.expr(stmt.value, scope, guard)
            value = self.binary(type(stmt.op).__name__, current, right, guard, stmt, scope)
            self.bind(stmt.target, value, stmt.value, scope, guard, stmt)
        elif t is ast.Return:
            value = self.expr(stmt.value, scope, guard) if stmt.value is not None else _const(None)
            if self.inline_stack:
                scope.returns.append((value, guard))
            else:
                self.emit("return", "return", (value,), (), guard, stmt, outputs=())
            raise _Terminated
        elif t is ast.Raise:
            raise _Terminated(raised=True)
        elif t is ast.If:
            return self.if_statement(stmt, scope, guard)
        elif t is ast.For or t is ast.AsyncFor:
            self.for_statement(stmt, scope, guard)
        elif t is ast.While:
            self.loop_body(stmt, stmt.body, scope, guard, self.src.segment(stmt.test), None)
        elif t is ast.With or t is ast.AsyncWith:
            for item in stmt.items:
                if _has_data(item.context_expr, scope):
                    self.data_expr(item.context_expr, scope, guard)
            return self.block(stmt.body, scope, guard)
        elif t is ast.Try:
            return self.try_statement(stmt, scope, guard)
        elif t is ast.Expr:
            if isinstance(stmt.value, (ast.Yield, ast.YieldFrom)):
                inner = stmt.value.value
                value = self.expr(inner, scope, guard) if inner is not None else _const(None)
                self.emit("yield", "yield", (value,), (), guard, stmt, outputs=())
            elif not isinstance(stmt.value, ast.Constant):  # docstrings
                fill = self.in_place_fill(stmt.value, scope)
                if fill is not None:
                    self.fill_in_place(stmt, fill, scope, guard)
                else:
                    self.expr(stmt.value, scope, guard)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.notes.append(f"line {stmt.lineno}: nested definition {stmt.name!r} not followed")
            scope.env.pop(stmt.name, None)
        elif t is ast.Assert:
            # the test reads values (`assert attn.size() == (b, n, m)`): a rewrite that removes one
            # must see that read (the message is only formatted when the test fails)
            if _has_data(stmt.test, scope):
                self.data_expr(stmt.test, scope, guard)
        elif isinstance(stmt, (ast.Pass, ast.Delete, ast.Global, ast.Nonlocal, ast.Import,
                               ast.ImportFrom, ast.Break, ast.Continue)):
            pass
        elif isinstance(stmt, ast.Match):
            self.notes.append(f"line {stmt.lineno}: match statement not followed")
        return guard

    def in_place_fill(self, e: ast.expr, scope: _Scope) -> ast.expr | None:
        """`name.masked_fill_(...)` (or `.mul_(x)`, `.add_(x)`, ...) on a local of this function's own
        body, as the out-of-place call."""
        if not (type(e) is ast.Call and type(e.func) is ast.Attribute
                and (e.func.attr in _IN_PLACE or e.func.attr in _IN_PLACE_OPERATORS)
                and type(e.func.value) is ast.Name and e.func.value.id in scope.env) or self.inline_stack:
            return None
        if e.func.attr in _IN_PLACE_OPERATORS:
            if len(e.args) != 1 or e.keywords or type(e.args[0]) is ast.Starred:
                return None
            # `s.mul_(x)` as `s * x`: the operator's reading (a number folded into a scale) applies
            op = ast.copy_location(_IN_PLACE_OPERATORS[e.func.attr](), e)
            binop = ast.copy_location(ast.BinOp(e.func.value, op, e.args[0]), e)
            self.src.made.extend((op, binop))
            return binop
        func = ast.copy_location(ast.Attribute(e.func.value, _IN_PLACE[e.func.attr], ast.Load()), e.func)
        call = ast.copy_location(ast.Call(func, e.args, e.keywords), e)
        self.src.made.extend((func, call))
        return call

    def fill_in_place(self, stmt: ast.Expr, fill: ast.expr, scope: _Scope, guard: tuple[Cond, ...]) -> None:
        """`s.masked_fill_(m, v)` is `s = s.masked_fill(m, v)` where that is exact: the tensor was
        computed here by an op that makes a new one and nothing may hold it under another name, so no
        other value sees the change. Otherwise the call stays in place, a statement reading `s`."""
        target = stmt.value.func.value  # type: ignore[attr-defined]  # the Name `s` of `s.<op>_(...)`
        assert isinstance(target, ast.Name)
        before = scope.env[target.id]
        count = len(self.nodes)
        value = self.expr(fill, scope, guard)
        if len(self.nodes) == count:  # nothing computed (an operand folded away): the call stays in place
            self.expr(stmt.value, scope, guard)
            return
        node = self.nodes[-1]
        held = {ssa for name, ssa in scope.env.items() if name != target.id}
        if type(value) is Var and node.outputs == (value.name,) and self._unaliased(before, node, held):
            self.bind(target, value, None, scope, guard, stmt)
            self.filled_in_place[scope.env[target.id]] = before
        else:
            self.nodes[-1] = _new_node(node.kind, "." + stmt.value.func.attr, node.inputs,  # type: ignore[attr-defined]
                                       node.kwargs, node.outputs, node.target, node.guard, node.pos, node.via)

    def _unaliased(self, ssa: str, fill: Node, held: set[str]) -> bool:
        """The tensor `ssa` names (with the values it merges with or was filled in place from) is
        one that an op of this function made new, and every read of it so far leaves no alias: a
        metadata read, an op that computes a new tensor from it, a merge, an in-place fill. It may
        also be a view of such a tensor (`w = w.view(bsz, heads, tgt, src)`, then `w.masked_fill_(...)`,
        which fills the viewed tensor too) where no name (`held`: the names but the filled one) holds
        any of the two any more: nothing can read the viewed tensor after the fill."""
        defs = {out: node for node in self.nodes for out in node.outputs}
        group, todo = {ssa}, [ssa]
        views: set[int] = set()  # the views of the group's tensors that the group holds
        while todo:
            current = todo.pop()
            node = defs.get(current)
            if node is not None and node.kind == "op" and node.op in _VIEWS and node.inputs \
                    and type(node.inputs[0]) is Var:
                views.add(id(node))
                linked = [node.inputs[0].name]
            elif node is None or not (node.kind == "phi" or current in self.filled_in_place
                                      or node.kind == "op" and node.op in _FRESH_TENSOR):
                return False
            else:
                linked = [v.name for v in node.inputs if type(v) is Var] if node.kind == "phi" else \
                    [self.filled_in_place[current]] if current in self.filled_in_place else []
            for user in self.nodes:
                if user is fill or id(user) in views \
                        or not any(_mentions(v, current) for v in (*user.inputs, *(v for _, v in user.kwargs))):
                    continue
                if user.kind == "phi" or any(out in self.filled_in_place for out in user.outputs):
                    linked.extend(user.outputs)
                elif user.kind == "op" and user.op in _VIEWS and any(out in group for out in user.outputs):
                    continue  # the view the walk came up from
                elif not (user.kind == "op" and (user.op in _FRESH_TENSOR or _reads_metadata(user))):
                    return False
            for other in linked:
                if other not in group:
                    group.add(other)
                    todo.append(other)
        return not views or not group & held

    def if_statement(self, stmt: ast.If, scope: _Scope, guard: tuple[Cond, ...]) -> tuple[Cond, ...]:
        test = self.data_expr(stmt.test, scope, guard) if _has_data(stmt.test, scope) else None
        text = self.src.segment(stmt.test)
        if self.cond_count >= MAX_CONDS_PER_METHOD:
            self.notes.append(f"line {stmt.lineno}: more than {MAX_CONDS_PER_METHOD} branches; later ones flattened")
            guard = self.block(stmt.body, scope, guard)
            return self.block(stmt.orelse, scope, guard)
        cid = self.new_cond(stmt.test)
        text = self.caller_text(stmt.test, scope, text)
        yes, no = _cond(cid, text, True), _cond(cid, text, False)
        before = dict(scope.env)
        layers_before = dict(scope.layers)
        ended_yes = ended_no = False
        raised_yes = raised_no = False
        try:
            self.block(stmt.body, scope, (*guard, yes))
        except _Terminated as exc:
            ended_yes, raised_yes = True, exc.raised
        env_yes = scope.env
        scope.env = dict(before)
        scope.layers = dict(layers_before)
        try:
            self.block(stmt.orelse, scope, (*guard, no))
        except _Terminated as exc:
            ended_no, raised_no = True, exc.raised
        env_no = scope.env
        if ended_yes and ended_no:
            raise _Terminated(raised=raised_yes and raised_no)
        # After a branch that returns, the rest of the block runs only on the other branch. After
        # one that raises (a validation), the code simply goes on: no decision is recorded for it.
        if ended_yes:
            scope.env = env_no
            return guard if raised_yes else (*guard, no)
        if ended_no:
            scope.env = env_yes
            return guard if raised_no else (*guard, yes)
        scope.env = self.merge(before, env_yes, env_no, guard, stmt, cid, test)
        return guard

    def merge(self, before: dict[str, str], a: dict[str, str], b: dict[str, str], guard: tuple[Cond, ...],
              at: ast.AST, cid: int | None = None, test: Operand | None = None) -> dict[str, str]:
        """Phi nodes for names that differ between branch `a` (condition `cid` true) and `b`. A phi
        records the condition (`if=`) and, when the test reads data, its value (`test=`)."""
        merged = dict(before)
        # names bound alike on both sides and as before need nothing; nor does a name that one
        # side keeps as before and the other unbinds (it stays as before)
        get_before = before.get
        if b == before:  # a loop body, or an `if` without `else`
            if a == before:  # neither branch (re)bound a name: the common case
                return merged
            changed = [n for n, v in a.items() if get_before(n) != v]
        elif a == before:
            changed = [n for n, v in b.items() if get_before(n) != v]
        else:
            get_b = b.get
            changed = [n for n, v in a.items() if get_b(n) != v or get_before(n) != v]
            changed += [n for n in b if n not in a]
        if len(changed) > 1:
            changed.sort(key=lambda n: (n not in before, n))
        meta: tuple[tuple[str, Operand], ...] = ()
        if cid is not None:
            meta = (("if", _const(cid)),) + ((("test", test),) if isinstance(test, Var) else ())
        for name in changed:
            va, vb = a.get(name), b.get(name)
            if va == vb or va is None or vb is None:
                # defined on one side only: later uses read that definition (on the other path
                # the name is unbound, so no use can be reached there)
                if va is not None or vb is not None:
                    merged[name] = va if va is not None else vb  # type: ignore[assignment]
                continue
            inputs = tuple(_VARS[v] for v in (va, vb) if v is not None)
            out = self.fresh(name)
            if all(self.kinds.get(v.name) == "scalar" for v in inputs):
                self.kinds[out] = "scalar"
            self.nodes.append(_new_node("phi", "phi", inputs, meta, (out,), None, guard, None, self.via))
            merged[name] = out
        return merged

    def for_statement(self, stmt: ast.For | ast.AsyncFor, scope: _Scope, guard: tuple[Cond, ...]) -> None:
        text = f"for {self.src.segment(stmt.target)} in {self.src.segment(stmt.iter)}"
        element_target = self.iter_layer_target(stmt.iter)
        self.loop_body(stmt, stmt.body, scope, guard, text, (stmt.target, stmt.iter, element_target))

    def iter_layer_target(self, iterable: ast.expr) -> str | None:
        # for layer in self.layers / for i, layer in enumerate(self.layers) / zip(...)
        if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "enumerate" \
                and iterable.args:
            inner = self.iter_layer_target(iterable.args[0])
            return f"enumerate:{inner}" if inner else None
        attr = _self_attr(iterable)
        if attr is not None and attr in self.table:
            return f"{attr}[*]"
        return None

    def loop_body(self, stmt: ast.stmt, body: list[ast.stmt], scope: _Scope, guard: tuple[Cond, ...], text: str,
                  loop: tuple[ast.expr, ast.expr, str | None] | None) -> None:
        cid = self.new_cond(None)
        inside = (*guard, _cond(cid, text, True))
        before = dict(scope.env)
        layers_before = dict(scope.layers)
        if loop is not None:
            target, iterable, element = loop
            if element is not None:
                names = target
                if element.startswith("enumerate:") and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                    names = target.elts[1]
                    element = element[len("enumerate:"):]
                    self.bind(target.elts[0], _const(0), None, scope, inside, stmt, kind="scalar")
                if isinstance(names, ast.Name):
                    scope.layers[names.id] = element
                    scope.env.pop(names.id, None)
            else:
                value = self.data_expr(iterable, scope, guard) if _has_data(iterable, scope) else None
                if value is not None:
                    out = self.emit("op", "iter", (value,), (), inside, iterable)
                    self.bind(target, _VARS[out[0]], iterable, scope, inside, stmt)
                else:
                    for name in _names(target):
                        scope.env.pop(name, None)
        try:
            self.block(body, scope, inside)
        except _Terminated:
            scope.env = dict(before)
        scope.layers = layers_before
        scope.env = self.merge(before, scope.env, before, guard, stmt, cid)

    def try_statement(self, stmt: ast.Try, scope: _Scope, guard: tuple[Cond, ...]) -> tuple[Cond, ...]:
        try:
            guard = self.block(stmt.body, scope, guard)
            guard = self.block(stmt.orelse, scope, guard)
        except _Terminated:
            if not stmt.finalbody:
                raise
        return self.block(stmt.finalbody, scope, guard)

    # -- binding -------------------------------------------------------------------------------

    def bind(self, target: Any, value: Operand, value_expr: ast.expr | None, scope: _Scope,
             guard: tuple[Cond, ...], at: ast.AST, kind: str | None = None) -> None:
        t = type(target)
        if t is ast.Name:
            # `layer = self.layers[i]`: a local name for a module
            if value_expr is not None and type(value_expr) in _MAY_NAME_A_LAYER:
                layer_target = self.layer_target(value_expr, scope)
                if layer_target is not None and not self._slices_a_tensor(layer_target):
                    scope.layers[target.id] = layer_target
                    scope.env.pop(target.id, None)
                    return
            scope.layers.pop(target.id, None)
            name = self.fresh(target.id)
            if isinstance(value, Var):
                # rename the producing node's output when it is a fresh temporary
                last = self.nodes[-1] if self.nodes else None
                if last is not None and last.outputs == (value.name,) and value.name in self.generated:
                    self.nodes[-1] = _with_outputs(last, (name,))
                    if value.name in self.kinds:
                        self.kinds[name] = self.kinds.pop(value.name)
                else:
                    self.emit("op", "assign", (value,), (), guard, at, outputs=(name,))
                    if value.name in self.kinds:
                        self.kinds[name] = self.kinds[value.name]
            else:
                self.emit("op", "assign", (value,), (), guard, at, outputs=(name,))
                if isinstance(value, Const) and isinstance(value.value, (int, float)):
                    self.kinds[name] = "scalar"
                elif isinstance(value, Sym):
                    self.kinds[name] = "scalar"
            if kind:
                self.kinds[name] = kind
            scope.env[target.id] = name
        elif t is ast.Tuple or t is ast.List:
            names = target.elts
            spread: ast.Tuple | ast.List | None = None
            if isinstance(value_expr, (ast.Tuple, ast.List)) and any(isinstance(e, ast.Starred) for e in value_expr.elts):
                spread = value_expr
            if spread is not None and isinstance(value, Seq) and self.bind_spread(names, value, spread, scope, guard, at):
                return
            if isinstance(value, Seq) and len(value.items) == len(names) and spread is None \
                    and not any(isinstance(n, ast.Starred) for n in names):
                for sub, item in zip(names, value.items, strict=True):
                    self.bind(sub, item, None, scope, guard, at)
                return
            if all(isinstance(n, ast.Name) for n in names):
                outs = tuple(self.fresh(n.id) for n in names)  # type: ignore[attr-defined]
                last = self.nodes[-1] if self.nodes else None
                if isinstance(value, Var) and last is not None and last.outputs == (value.name,) \
                        and value.name in self.generated:
                    self.nodes[-1] = _with_outputs(last, outs)
                else:
                    self.emit("op", "unpack", (value,), (), guard, at, outputs=outs)
                for n, out in zip(names, outs, strict=True):
                    scope.env[n.id] = out  # type: ignore[attr-defined]
                    scope.layers.pop(n.id, None)  # type: ignore[attr-defined]
                return
            star = next((i for i, n in enumerate(names) if isinstance(n, ast.Starred)), len(names))
            for i, sub in enumerate(names):
                # past a starred name the items are counted from the end; the starred one is a slice
                index: Operand = _const(i) if i < star else _const(i - len(names)) if i > star \
                    else _sym(f"{i}:{i + 1 - len(names) or ''}")
                if isinstance(sub, ast.Starred):
                    sub = sub.value
                picked = self.emit("op", "getitem", (value, index), (), guard, at)
                self.bind(sub, _VARS[picked[0]], None, scope, guard, at)
        elif isinstance(target, ast.Attribute):
            owner = _self_attr(target)
            if owner is not None or isinstance(target.value, ast.Name) and target.value.id == "self":
                self.emit("store", "store", (value,), (), guard, at, target=self.src.segment(target), outputs=())
            elif _has_data(target.value, scope):
                obj = self.expr(target.value, scope, guard)
                self.emit("store", "setattr", (obj, _const(target.attr), value), (), guard, at, outputs=())
        elif isinstance(target, ast.Subscript):
            if _has_data(target.value, scope) and isinstance(target.value, ast.Name):
                obj = self.expr(target.value, scope, guard)
                index = self.expr(target.slice, scope, guard)
                name = self.fresh(target.value.id)
                self.emit("op", "setitem", (obj, index, value), (), guard, at, outputs=(name,))
                scope.env[target.value.id] = name
            elif _self_attr(target.value) is not None:
                self.emit("store", "store", (value,), (), guard, at, target=self.src.segment(target), outputs=())
        elif isinstance(target, ast.Starred):
            self.bind(target.value, value, value_expr, scope, guard, at)

    def bind_spread(self, names: list[ast.expr], value: Seq, value_expr: ast.Tuple | ast.List, scope: _Scope,
                    guard: tuple[Cond, ...], at: ast.AST) -> bool:
        """`b, n, h = *x.shape, self.heads`: the names a tuple with one starred item spreads over,
        that item's as many as the other names leave; a whole shape spread so is unpacked into them
        (`x.shape -> b, n`: x's rank is proven, engine/analysis/shapes.py), any other item read by
        index. False where it is not so (a starred name, several starred items, too few names)."""
        stars = [i for i, e in enumerate(value_expr.elts) if isinstance(e, ast.Starred)]
        width = len(names) - len(value.items) + 1
        if len(stars) != 1 or len(value.items) != len(value_expr.elts) or width < 0 \
                or any(isinstance(n, ast.Starred) for n in names):
            return False
        i = stars[0]
        spread, item = names[i:i + width], value.items[i]
        star = next((k for k in range(len(self.nodes) - 1, -1, -1) if self.nodes[k].outputs == (item.name,)), None) \
            if isinstance(item, Var) else None
        if star is None or self.nodes[star].op != "starred":
            return False
        item = self.nodes.pop(star).inputs[0]  # the value spread: the tuple is not kept
        for sub, other in zip([*names[:i], *names[i + width:]], [*value.items[:i], *value.items[i + 1:]], strict=True):
            self.bind(sub, other, None, scope, guard, at)
        made = next((k for k in range(len(self.nodes) - 1, -1, -1) if self.nodes[k].outputs == (item.name,)), None) \
            if isinstance(item, Var) and item.name in self.generated else None
        node = self.nodes[made] if made is not None else None
        whole = node is not None and node.kind == "op" and (
            node.op == "getattr" and node.inputs[1:] == (Const("shape"),) or node.op == ".size" and len(node.inputs) == 1)
        if whole and width and all(isinstance(n, ast.Name) for n in spread):
            outs = tuple(self.fresh(n.id) for n in spread)  # type: ignore[attr-defined]
            self.nodes[made] = _with_outputs(node, outs)  # type: ignore[index,arg-type]
            for n, out in zip(spread, outs, strict=True):
                scope.env[n.id] = out  # type: ignore[attr-defined]
                scope.layers.pop(n.id, None)  # type: ignore[attr-defined]
            return True
        for j, sub in enumerate(spread):
            picked = self.emit("op", "getitem", (item, _const(j)), (), guard, at)
            self.bind(sub, _VARS[picked[0]], None, scope, guard, at)
        return True

    def layer_target(self, expr: Any, scope: _Scope) -> str | None:
        """The layer a callee expression names: `self.query`, `self.layers[i]`, a local alias."""
        t = type(expr)
        if t is ast.Name:
            return scope.layers.get(expr.id)  # type: ignore[attr-defined]
        if scope.self_class is None:
            return None
        attr = _self_attr(expr)
        if attr is not None:
            return attr if attr in self.table else None
        if t is ast.Subscript:
            base = self.layer_target(expr.value, scope) if not isinstance(expr.value, ast.Name) else scope.layers.get(expr.value.id)
            if base is None:
                return None
            index = _literal(expr.slice)
            specific = f"{base}[{index}]" if isinstance(index, int) and not isinstance(index, bool) else None
            if specific and self.lookup_layer(specific):
                return specific
            if isinstance(index, str):
                keyed = f"{base}[{index!r}]"
                if self.lookup_layer(keyed):
                    return keyed
            return f"{base}[*]"
        if t is ast.Attribute:
            base = self.layer_target(expr.value, scope)
            if base is not None:
                return f"{base}.{expr.attr}"
        return None

    def _slices_a_tensor(self, target: str) -> bool:
        """`causal_mask = self.bias[:, :, a:b, :b]`: a slice of a buffer or parameter is a tensor
        value, not a local name for a module."""
        if not target.endswith("]"):
            return False
        owner = self.lookup_layer(target.partition("[")[0])
        return owner is not None and owner.type in _TENSOR_TYPES

    def lookup_layer(self, target: str) -> LayerDef | None:
        """The LayerDef for a target path, looking inside ModuleList/Sequential items."""
        defs = self.table.get(target)
        if defs:
            return defs[-1]
        if target.endswith("]"):
            base, _, index = target[:-1].rpartition("[")
            parent = self.lookup_layer(base)
            if parent is not None and parent.items:
                if index == "*" or len(parent.items) == 1:
                    return parent.items[0] if len(parent.items) == 1 or index == "*" and _uniform(parent.items) else None
                for item in parent.items:
                    if item.attr == target:
                        return item
        return None

    def layer_type(self, target: str) -> str:
        defs = self.table.get(target)
        if defs:
            known = [d.type for d in defs if d.type != "?"]
            return known[0] if known else "?"
        found = self.lookup_layer(target)
        return found.type if found is not None else "?"

    # -- expressions -----------------------------------------------------------------------

    def expr(self, e: ast.expr | None, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        """Emit the nodes computing `e`; return the operand holding its value."""
        if e is None:
            return _const(None)
        t = type(e)
        if t is _Name:
            ssa = scope.env.get(e.id)  # type: ignore[attr-defined]
            if ssa is not None:
                return _VARS[ssa]
            if e.id in scope.layers:  # type: ignore[attr-defined]
                return _sym(scope.layers[e.id])  # type: ignore[attr-defined]
            return _sym(e.id)  # type: ignore[attr-defined]
        if t is _Constant:  # reads no data: its literal, or its text (bytes, NaN, complex)
            literal = _literal(e)
            return _const(literal) if literal is not _NOT_LITERAL else _sym(self.src.segment(e))
        if not _has_data(e, scope):
            literal = _literal(e)
            if literal is not _NOT_LITERAL:
                return _const(literal)
            if t is ast.Call and self.callable_is_layer_or_inlinable(e.func, scope):  # type: ignore[attr-defined]
                pass  # a layer called on no data (e.g. self.embed(self.position_ids)) is still a node
            else:
                return _sym(self.src.segment(e))
        return self.data_expr(e, scope, guard)

    def data_expr(self, e: Any, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        """`expr` of an expression known to read data (`_has_data(e, scope)` was just found true)."""
        # a chain of type tests, most frequent first (not a dict of unbound methods: compiled,
        # these are direct calls)
        t = type(e)
        if t is _Call:
            return self.call(e, scope, guard)
        if t is _Attribute:
            return self.attribute_expr(e, scope, guard)
        if t is _BinOp:
            return self.binop_expr(e, scope, guard)
        if t is _Subscript:
            return self.subscript_expr(e, scope, guard)
        if t is _Tuple or t is _List:
            return self.sequence_expr(e, scope, guard)
        if t is ast.Compare:
            return self.compare_expr(e, scope, guard)
        if t is ast.UnaryOp:
            return self.unary_expr(e, scope, guard)
        if t is ast.IfExp:
            return self.if_expression(e, scope, guard)
        if t is ast.BoolOp:
            return self.boolop_expr(e, scope, guard)
        if t is ast.Starred:
            return self.starred_expr(e, scope, guard)
        if t is ast.NamedExpr:
            return self.named_expr(e, scope, guard)
        if t is _Name:
            return self.expr(e, scope, guard)
        # comprehensions, lambdas, f-strings, dicts, ... over data: one opaque node
        inputs = tuple(_VARS[scope.env[n]] for n in _data_names(e, scope))
        kind = t.__name__.lower()
        out = self.emit("op", kind, inputs, (("text", _sym(self.src.segment(e))),), guard, e)
        return _VARS[out[0]]

    def binop_expr(self, e: ast.BinOp, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        left = self.expr(e.left, scope, guard)
        right = self.expr(e.right, scope, guard)
        return self.binary(type(e.op).__name__, left, right, guard, e, scope)

    def unary_expr(self, e: ast.UnaryOp, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        operand = self.expr(e.operand, scope, guard)
        if isinstance(e.op, ast.USub) and isinstance(operand, Const) and isinstance(operand.value, (int, float)):
            return _const(-operand.value)
        out = self.emit("op", C.UNARY[type(e.op).__name__], (operand,), (), guard, e)
        if isinstance(operand, Var) and self.kinds.get(operand.name) == "scalar":
            self.kinds[out[0]] = "scalar"
        return _VARS[out[0]]

    def attribute_expr(self, e: ast.Attribute, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        if isinstance(e.value, ast.Name) and e.value.id == "self":
            return _sym(f"self.{e.attr}")  # a parameter or buffer: a value, not a computation
        obj = self.expr(e.value, scope, guard)
        out = self.emit("op", "getattr", (obj, _const(e.attr)), (), guard, e)
        if e.attr == "shape":
            self.kinds[out[0]] = "shape"  # x.shape[-1] is a number
        elif e.attr == "ndim":
            self.kinds[out[0]] = "scalar"
        return _VARS[out[0]]

    def subscript_expr(self, e: ast.Subscript, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        obj = self.expr(e.value, scope, guard)
        index = self.data_expr(e.slice, scope, guard) if _has_data(e.slice, scope) else self.index_operand(e.slice)
        out = self.emit("op", "getitem", (obj, index), (), guard, e)
        if isinstance(obj, Var) and (self.kinds.get(obj.name) == "shape" and isinstance(index, Const)
                                     and isinstance(index.value, int)):
            self.kinds[out[0]] = "scalar"
        elif isinstance(obj, Var) and self.kinds.get(obj.name) == "shape":
            self.kinds[out[0]] = "shape"
        return _VARS[out[0]]

    def sequence_expr(self, e: ast.Tuple | ast.List, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        items = tuple([self.expr(item, scope, guard) for item in e.elts])  # `*value`: a `starred` node
        return _seq(items, "list" if type(e) is ast.List else "tuple")

    def compare_expr(self, e: ast.Compare, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        left = self.expr(e.left, scope, guard)
        rights = [self.expr(c, scope, guard) for c in e.comparators]
        op = "compare:" + ",".join(type(o).__name__.lower() for o in e.ops)
        out = self.emit("op", op, (left, *rights), (), guard, e)
        return _VARS[out[0]]

    def boolop_expr(self, e: ast.BoolOp, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        values = tuple([self.expr(v, scope, guard) for v in e.values])
        out = self.emit("op", type(e.op).__name__.lower(), values, (), guard, e)
        return _VARS[out[0]]

    def starred_expr(self, e: ast.Starred, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        """`*value` among a call's arguments: a node of its own (`starred`), so that no reader of the
        arguments takes the items it spreads for one (`x.view(*x.shape[:2], -1)` names 3 sizes)."""
        value = self.expr(e.value, scope, guard)
        return _VARS[self.emit("op", "starred", (value,), (), guard, e)[0]]

    def named_expr(self, e: ast.NamedExpr, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        value = self.expr(e.value, scope, guard)
        self.bind(e.target, value, e.value, scope, guard, e)
        return _VARS[scope.env[e.target.id]] if e.target.id in scope.env else value

    def index_operand(self, index: ast.expr) -> Operand:
        literal = _literal(index)
        if literal is not _NOT_LITERAL:
            return _const(literal)
        return _sym(self.src.segment(index))

    def if_expression(self, e: ast.IfExp, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        test = self.data_expr(e.test, scope, guard) if _has_data(e.test, scope) else None
        cid = self.new_cond(e.test)
        text = self.caller_text(e.test, scope, self.src.segment(e.test))
        yes = self.expr(e.body, scope, (*guard, _cond(cid, text, True)))
        no = self.expr(e.orelse, scope, (*guard, _cond(cid, text, False)))
        out = self.fresh("_if")
        self.generated.add(out)
        inputs: list[Operand] = []
        for value, taken in ((yes, True), (no, False)):
            if isinstance(value, Var):
                inputs.append(value)
            else:
                tmp = self.emit("op", "assign", (value,), (), (*guard, _cond(cid, text, taken)), e)
                inputs.append(_VARS[tmp[0]])
        meta: tuple[tuple[str, Operand], ...] = (("if", _const(cid)),) + ((("test", test),) if isinstance(test, Var) else ())
        self.nodes.append(_new_node("phi", "phi", tuple(inputs), meta, (out,), None, guard, None, self.via))
        return _VARS[out]

    def binary(self, opname: str, left: Operand, right: Operand, guard: tuple[Cond, ...], at: ast.AST,
               scope: _Scope) -> Operand:
        op = C.BINARY.get(opname, opname.lower())
        left_scalar = self.is_scalar(left)
        right_scalar = self.is_scalar(right)
        if left_scalar and right_scalar:
            out = self.emit("op", op, (left, right), (), guard, at)
            self.kinds[out[0]] = "scalar"
            return _VARS[out[0]]
        if op == "pow" and right_scalar:
            # `x ** 2` is the same node as `torch.pow(x, 2)` and `x.pow(2)`
            out = self.emit("op", "pow", (left,), (("exponent", right),), guard, at)
            return _VARS[out[0]]
        if op in ("mul", "div") and (right_scalar or left_scalar and op == "mul"):
            # a tensor times or over a number: one `scale` node whose factor multiplies.
            # `x * d ** -0.5`, `x * self.scale` keep their factor; `x / math.sqrt(d)` has the factor
            # `1 / (math.sqrt(d))`, so that rules bind one `$factor` for every spelling.
            tensor, factor = (left, right) if right_scalar else (right, left)
            if op == "div":
                factor = _sym(f"1 / {_parenthesize(self.python_text(factor))}")
            out = self.emit("op", "scale", (tensor, factor), (), guard, at)
            return _VARS[out[0]]
        out = self.emit("op", op, (left, right), (), guard, at)
        return _VARS[out[0]]

    def python_text(self, operand: Operand) -> str:
        """An operand as Python source at this point of the method."""
        if isinstance(operand, Const):
            return repr(operand.value)
        if isinstance(operand, Sym):
            return operand.text
        if isinstance(operand, Var):
            node = self.nodes[-1] if self.nodes else None
            for candidate in reversed(self.nodes):
                if operand.name in candidate.outputs:
                    node = candidate
                    break
            if operand.name in self.generated and node is not None and node.pos is not None:
                return self.src.segment_at(node.pos)
            return operand.name.split(".", 1)[0]
        return "?"

    def is_scalar(self, operand: Operand) -> bool:
        t = type(operand)
        if t is Var:
            return self.kinds.get(operand.name) == "scalar"  # type: ignore[union-attr]
        if t is Const:
            return isinstance(operand.value, (int, float)) and not isinstance(operand.value, bool)  # type: ignore[union-attr]
        if t is Sym:
            # `self.scale`, `config.x`, `math.sqrt(d)`: not data. A module parameter/buffer
            # registered in __init__ would be in the layer table and is not a scalar.
            text = operand.text  # type: ignore[union-attr]
            if text.startswith("self.") and (text.partition("(")[0] in self.table or text in self.tensor_attrs()):
                return False
            return not text.startswith(("torch.", "self.weight", "self.bias"))
        return False

    # -- calls ---------------------------------------------------------------------------------

    def callable_is_layer_or_inlinable(self, func: ast.expr, scope: _Scope) -> bool:
        """Calls that are nodes even when they read no tracked data: layers, and the construction of
        optimizers (`torch.optim.AdamW(self.parameters(), lr=self.lr)`), which rules rewrite."""
        if self.layer_target(func, scope) is not None:
            return True
        name = _qualify(self.fx.imports.names, func)
        return name is not None and name.startswith("torch.optim.")

    def call(self, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        func = e.func
        # 1. a layer: self.query(x), self.layers[i](x), layer(x)
        target = self.layer_target(func, scope)
        if target is not None:
            return self.layer_call(target, e, scope, guard)
        # 2. a helper method of this module: self.transpose_for_scores(x)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and scope.self_class is not None:
            helper = self.find_method(func.attr)
            if helper is not None and func.attr != "forward":
                inlined = self.inline(helper, e, scope, guard, bound_self=True)
                if inlined is not None:
                    return inlined
        # 2b. `super().forward(...)` in the forward of a submodule being inlined
        if self.super_owners and isinstance(func, ast.Attribute) and func.attr == "forward" \
                and _is_bare_super(func.value) and self.super_owners[-1]:
            inlined = self.inline_forward(self.super_owners[-1], e, scope, guard)
            if inlined is not None:
                return inlined
        # 2c. a method called through a class of this file, `MultiheadAttention.apply_sparse_mask(w, ...)`:
        # a plain function of its arguments (no instance is bound; a classmethod's class would be; and
        # `Base.forward(self, x)` would read this module's layers, which a plain function has not)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id not in scope.env \
                and func.value.id in self.fx.classes \
                and not (e.args and isinstance(e.args[0], ast.Name) and e.args[0].id == "self"):
            method = self.class_function(func.value.id, func.attr)
            if method is not None:
                inlined = self.inline(method, e, scope, guard, bound_self=False)
                if inlined is not None:
                    return inlined
        # 3. a module-level function of this file
        if isinstance(func, ast.Name) and func.id not in scope.env and func.id in self.fx.functions:
            inlined = self.inline(self.fx.functions[func.id], e, scope, guard, bound_self=False)
            if inlined is not None:
                return inlined
        # 4. a tensor method: x.view(...), x.softmax(-1)
        if isinstance(func, ast.Attribute) and _has_data(func.value, scope):
            receiver = self.data_expr(func.value, scope, guard)
            return self.op_call(func.attr, True, receiver, e, scope, guard)
        # 5. a function: torch.matmul(a, b), F.softmax(x, dim=-1), math.sqrt(d)
        name = _qualify(self.fx.imports.names, func)
        if name is None and isinstance(func, ast.Call):
            inline_layer = self.inline_layer_call(func, e, scope, guard)
            if inline_layer is not None:
                return inline_layer
        if name is None:
            callee = self.expr(func, scope, guard)
            args, kwargs = self.arguments(e, scope, guard)
            out = self.emit("op", "call", (callee, *args), kwargs, guard, e)
            return _VARS[out[0]]
        return self.op_call(name, False, None, e, scope, guard)

    # stateless layers built and called in one expression; `nn.Dropout(p)(x)` is not one of them
    # (a module built there is in training mode: it always drops)
    _INLINE_LAYERS = ("torch.nn.Softmax", "torch.nn.LogSoftmax", "torch.nn.GELU", "torch.nn.ReLU", "torch.nn.SiLU",
                      "torch.nn.Sigmoid", "torch.nn.Tanh")

    def inline_layer_call(self, ctor: ast.Call, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> Operand | None:
        """`nn.Softmax(dim=-1)(x)` (ImageGPT, CodeGen): the layer's op with its constructor's
        arguments as keywords, `softmax(x, dim=-1)`, when those arguments read no data."""
        layer_type = _qualify(self.fx.imports.names, ctor.func)
        if layer_type not in self._INLINE_LAYERS or len(e.args) != 1 or e.keywords \
                or any(type(a) is ast.Starred for a in ctor.args) or any(k.arg is None for k in ctor.keywords) \
                or any(_has_data(a, scope) for a in [*ctor.args, *(k.value for k in ctor.keywords)]):
            return None
        op, names = C.LAYER_OPS[layer_type]
        if len(ctor.args) > len(names):
            return None
        params = [(n, self.expr(a, scope, guard)) for n, a in zip(names, ctor.args, strict=False)]
        params += [(k.arg, self.expr(k.value, scope, guard)) for k in ctor.keywords]  # type: ignore[misc]
        x = self.expr(e.args[0], scope, guard)
        out = self.emit("op", op, (x,), tuple(params), guard, e, target=layer_type)
        return _VARS[out[0]]

    def arguments(self, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> tuple[tuple[Operand, ...], tuple[tuple[str, Operand], ...]]:
        env = scope.env
        expr = self.expr
        args: list[Operand] = []
        a: Any
        for a in e.args:
            ta = type(a)
            if ta is _Name:  # the common case, without a call of `expr`
                ssa = env.get(a.id)
                if ssa is not None:
                    args.append(_VARS[ssa])
                    continue
            args.append(expr(a, scope, guard))  # `*value` too: a `starred` node (`starred_expr`)
        if not e.keywords:
            return tuple(args), ()
        kwargs: list[tuple[str, Operand]] = []
        for k in e.keywords:
            value = k.value
            if type(value) is _Name:
                ssa = env.get(value.id)
                if ssa is not None:
                    kwargs.append((k.arg or "**", _VARS[ssa]))
                    continue
            kwargs.append((k.arg or "**", expr(value, scope, guard)))
        return tuple(args), tuple(kwargs)

    def op_call(self, name: str, is_method: bool, receiver: Operand | None, e: ast.Call, scope: _Scope,
                guard: tuple[Cond, ...]) -> Operand:
        if not is_method and name in C.EINSUM_FUNCTIONS:
            lowered = self.einsum_as_matmul(name, e, scope, guard)
            if lowered is not None:
                return lowered
        if not is_method and name == "torch.baddbmm":
            lowered = self.baddbmm_as_add(name, e, scope, guard)
            if lowered is not None:
                return lowered
        args, kwargs = self.arguments(e, scope, guard)
        if name in ("permute", "torch.permute") and _swaps_last_two(args if is_method else args[1:]):
            # `k.permute(0, 1, 3, 2)`: permute names every dimension, so this is transpose(-2, -1)
            tensor = receiver if is_method and receiver is not None else args[0]
            out = self.emit("op", "transpose", (tensor,), (("dim0", Const(-2)), ("dim1", Const(-1))), guard, e,
                            target=f".{name}" if is_method else name)
            return _VARS[out[0]]
        if is_method:
            canonical = C.METHODS.get(name)
            op = canonical or f".{name}"
            inputs: tuple[Operand, ...] = (receiver, *args)  # type: ignore[arg-type]
        else:
            canonical = C.FUNCTIONS.get(name)
            op = canonical or name
            inputs = args
        if canonical is not None:
            inputs, kwargs = _normalize_signature(canonical, inputs, kwargs)
        # `target` keeps the spelling (resolved): canonical `softmax` from `torch.nn.functional.softmax`
        spelled = f".{name}" if is_method else name
        out = self.emit("op", op, inputs, kwargs, guard, e, target=spelled if spelled != op else None)
        if (is_method and (name in C.SCALAR_METHODS or name == "size" and args)) or \
                (not is_method and name in C.SCALAR_FUNCTIONS):
            self.kinds[out[0]] = "scalar"
        elif not is_method and name in C.ELEMENTWISE_NUMPY and args and not kwargs \
                and all(self.is_scalar(a) for a in args):
            self.kinds[out[0]] = "scalar"  # `np.sqrt(d)` of a number is a number (of an array, an array)
        elif (is_method and name == "size" and not args) or op == "getattr":
            self.kinds[out[0]] = "shape"
        return _VARS[out[0]]

    def einsum_as_matmul(self, name: str, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> Operand | None:
        """A two-operand einsum that is a batched matrix product becomes the canonical nodes:
        `einsum('bhid,bhjd->bhij', q, k)` is `matmul(q, transpose(k, -2, -1))` and
        `einsum('bhij,bhjd->bhid', a, v)` is `matmul(a, v)` (torch.einsum puts the equation
        first, einops.einsum last). Anything else stays an einsum call."""
        if e.keywords or any(type(a) is ast.Starred for a in e.args):
            return None
        if name != "einops.einsum" and len(e.args) == 2 and type(e.args[1]) in (ast.Tuple, ast.List):
            # `torch.einsum(eq, (a, b))`: torch also takes the operands as one tuple or list
            eq_arg, operands = e.args[0], list(e.args[1].elts)  # type: ignore[attr-defined]
        elif len(e.args) == 3:
            eq_arg, operands = (e.args[0], e.args[1:]) if name != "einops.einsum" else (e.args[-1], e.args[:-1])
        else:
            return None
        if len(operands) != 2 or any(type(a) is ast.Starred for a in operands):
            return None
        if not (isinstance(eq_arg, ast.Constant) and isinstance(eq_arg.value, str)):
            return None
        plan = _einsum_product(eq_arg.value, einops=name == "einops.einsum")
        spelled = f"{name}({eq_arg.value!r})"  # the equation stays visible (rank inference reads it)
        if plan is None:
            lowering = _einsum_lowering(eq_arg.value, einops=name == "einops.einsum")
            if lowering is None:
                return None
            return self.einsum_lowered(name, spelled, lowering, e, scope, guard, operands)
        swap_a, swap_b, a_first = plan
        a, b = (self.expr(x, scope, guard) for x in operands)
        if swap_a:
            at = self.emit("op", "transpose", (a,), (("dim0", Const(-2)), ("dim1", Const(-1))), guard, e, target=name)
            a = _VARS[at[0]]
        if swap_b:
            bt = self.emit("op", "transpose", (b,), (("dim0", Const(-2)), ("dim1", Const(-1))), guard, e, target=name)
            b = _VARS[bt[0]]
        out = self.emit("op", "matmul", (a, b) if a_first else (b, a), (), guard, e, target=spelled)
        return _VARS[out[0]]

    def baddbmm_as_add(self, name: str, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> Operand | None:
        """`torch.baddbmm(input, b1, b2, beta=1, alpha=a)` is `input + a * (b1 @ b2)`: a batched
        product, a `scale` by `alpha` where it is not 1, and an `add` of `input` (left out where
        `beta=0`, which ignores `input`). The nodes carry the call's position and `target`. Another
        `beta` (its scaled input would be a value with no text of its own), unpacked arguments or
        other keywords: the call stays a call."""
        if len(e.args) != 3 or any(type(a) is ast.Starred for a in e.args) \
                or any(k.arg not in ("beta", "alpha") for k in e.keywords):
            return None
        beta_arg = next((k.value for k in e.keywords if k.arg == "beta"), None)
        if beta_arg is not None and not (isinstance(beta_arg, ast.Constant) and beta_arg.value in (0, 1)
                                         and not isinstance(beta_arg.value, bool)):
            return None
        bias, left, right = (self.expr(x, scope, guard) for x in e.args)  # in Python's order
        factors: dict[str, Operand] = {}
        for k in e.keywords:
            factors[k.arg or ""] = self.expr(k.value, scope, guard)
        product = self.emit("op", "matmul", (left, right), (), guard, e, target=name)
        value = _VARS[product[0]]
        alpha = factors.get("alpha")
        if alpha is not None and not (isinstance(alpha, Const) and alpha.value == 1):
            value = _VARS[self.emit("op", "scale", (value, alpha), (), guard, e, target=name)[0]]
        beta = factors.get("beta")
        if isinstance(beta, Const) and beta.value == 0:
            return value
        out = self.emit("op", "add", (value, bias), (), guard, e, target=name)
        return _VARS[out[0]]

    def einsum_lowered(self, name: str, spelled: str, lowering: tuple, e: ast.Call, scope: _Scope,
                       guard: tuple[Cond, ...], operands: list[Any]) -> Operand:
        """An einsum whose batch axes are ordered differently on its operands and output, or missing
        from one operand (broadcast: a multi-query key without a head axis), or that contracts
        several axes, as canonical nodes: each operand permuted to (batch..., row, contracted) and
        given a size-1 axis for each batch label it lacks, its contracted axes (and the right
        operand's row axes) flattened into one, a matmul, the right operand's row axes unflattened
        to the sizes it has there, and a permute of the result to the equation's output order.
        These nodes carry the einsum's position and `target` (they have no text of their own)."""
        a_plan, b_plan, unflat, out_perm = lowering
        lowered: list[Operand] = []
        values: list[Operand] = []
        for x, (perm, missing, runs, swap) in zip(operands, (a_plan, b_plan), strict=True):
            value = self.expr(x, scope, guard)
            values.append(value)
            if missing or runs or list(perm) != list(range(len(perm))):
                # also where it keeps the order: the permute proves the rank the new axes' and the
                # flattened runs' positions need
                node = self.emit("op", ".permute", (value, *(Const(d) for d in perm)), (), guard, e, target=name)
                value = _VARS[node[0]]
            for position in missing:
                node = self.emit("op", ".unsqueeze", (value, Const(position)), (), guard, e, target=name)
                value = _VARS[node[0]]
            for start, end in runs[::-1]:  # the later run first: the earlier one's positions stay
                node = self.emit("op", ".flatten", (value, Const(start), Const(end)), (), guard, e, target=name)
                value = _VARS[node[0]]
            if swap:
                node = self.emit("op", "transpose", (value,), (("dim0", Const(-2)), ("dim1", Const(-1))), guard, e,
                                 target=name)
                value = _VARS[node[0]]
            lowered.append(value)
        # the equation (which rank inference reads) goes on the product where it holds the output's axes
        out = self.emit("op", "matmul", (lowered[0], lowered[1]), (), guard, e, target=name if unflat else spelled)
        if unflat:
            sizes: list[Operand] = []
            for d in unflat:
                size = self.emit("op", ".size", (values[1], Const(d)), (), guard, e, target=name)
                self.kinds[size[0]] = "scalar"
                sizes.append(_VARS[size[0]])
            out = self.emit("op", ".unflatten", (_VARS[out[0]], Const(-1), Seq(tuple(sizes))), (), guard, e,
                            target=name)
        if out_perm is not None:
            out = self.emit("op", ".permute", (_VARS[out[0]], *(Const(d) for d in out_perm)), (), guard, e,
                            target=name)
        return _VARS[out[0]]

    def layer_call(self, target: str, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> Operand:
        layer = self.lookup_layer(target)
        if layer is not None and layer.type == "torch.nn.Sequential" and layer.items and len(e.args) == 1 \
                and not e.keywords:
            # calling a Sequential runs its items in order
            value = self.expr(e.args[0], scope, guard)
            for item in layer.items:
                out = self.emit("layer", item.type, (value,), (), guard, e, target=item.attr)
                value = _VARS[out[0]]
            return value
        if layer is not None and not e.keywords:
            owners = self.fx.stateless_forward(layer, target, self.chain)
            if owners:
                inlined = self.inline_forward(owners, e, scope, guard)
                if inlined is not None:
                    return inlined
        args, kwargs = self.arguments(e, scope, guard)
        out = self.emit("layer", self.layer_type(target), args, kwargs, guard, e, target=target)
        return _VARS[out[0]]

    def inline_forward(self, owners: list[ClassInfo], e: ast.Call, scope: _Scope, guard: tuple[Cond, ...]) -> Operand | None:
        """The `forward` of the first of `owners` inlined, its `super().forward(...)` calls being the
        next owner's."""
        self.super_owners.append(owners[1:])
        try:
            return self.inline(owners[0].methods["forward"], e, scope, guard, bound_self=True)
        finally:
            self.super_owners.pop()

    def find_method(self, name: str) -> ast.FunctionDef | None:
        fn: ast.FunctionDef | None = None
        for klass in self.chain:
            fn = klass.methods.get(name)
            if fn is not None:
                if self.fx is not self.root_fx:
                    self.owners[id(fn)] = self.root_fx  # called from an inherited method: `self` is this class
                break
        if fn is None:
            inherited = self.root_fx.inherited_method(self.chain, name)
            if inherited is None:
                return None
            fn = inherited[0]
            self.owners[id(fn)] = inherited[1]
        for dec in fn.decorator_list:
            if isinstance(dec, ast.Name) and dec.id == "property":
                return None
        return fn

    def class_function(self, class_name: str, name: str) -> ast.FunctionDef | None:
        """The method `name` of the class `class_name` (or of its bases in this file) as a plain
        function of its arguments: none for a property or a classmethod, which bind more than the call's
        arguments."""
        for klass in self.fx.mro(class_name):
            fn = klass.methods.get(name)
            if fn is not None:
                for dec in fn.decorator_list:
                    if isinstance(dec, ast.Name) and dec.id in ("property", "classmethod"):
                        return None
                return fn
        return None

    def inline(self, fn: ast.FunctionDef, e: ast.Call, scope: _Scope, guard: tuple[Cond, ...],
               bound_self: bool) -> Operand | None:
        key = f"{id(fn)}"
        if len(self.inline_stack) >= MAX_INLINE_DEPTH or key in self.inline_stack:
            return None
        if fn.args.vararg or fn.args.kwarg or any(isinstance(a, ast.Starred) for a in e.args) \
                or any(k.arg is None for k in e.keywords):
            return None
        # a decorated helper (`@compile`) computes what its body says: its nodes are the caller's steps;
        # a `@torch.jit.script` one is compiled on its own and is not read (the paper's labels count no
        # site in scripted helpers: reading them added three softmax findings to gpt_bigcode)
        owner = self.owners.get(id(fn), self.fx)  # the file holding `fn`: the code being read, unless recorded
        if owner.is_generator(fn) or _is_scripted(fn):
            return None
        params = [*fn.args.posonlyargs, *fn.args.args]
        is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
        if bound_self and not is_static:
            if not params:
                return None
            params = params[1:]
        kwonly = list(fn.args.kwonlyargs)
        if len(e.args) > len(params):
            return None
        args, kwargs = self.arguments(e, scope, guard)
        binding: dict[str, Operand] = {}
        for param, value in zip(params, args, strict=False):
            binding[param.arg] = value
        known = {p.arg for p in params} | {p.arg for p in kwonly}
        for key_name, value in kwargs:
            if key_name not in known:
                return None
            binding[key_name] = value
        defaults = dict(zip([p.arg for p in params][len(params) - len(fn.args.defaults):], fn.args.defaults, strict=True))
        defaults.update({p.arg: d for p, d in zip(kwonly, fn.args.kw_defaults, strict=True) if d is not None})
        env: dict[str, str] = {}
        callee_scope = _Scope(env, {}, scope.self_class if bound_self else None, scope.tensors if bound_self else frozenset())
        for param in [*params, *kwonly]:
            bound = binding.get(param.arg)
            if bound is None:
                default = defaults.get(param.arg)
                if default is None:
                    return None
                bound = _const_or_sym(default, owner.src)
            if isinstance(bound, Var):
                env[param.arg] = bound.name
            else:
                ssa = self.fresh(param.arg)
                self.emit("op", "assign", (bound,), (), guard, e, outputs=(ssa,))
                if isinstance(bound, Const) and (bound.value is None or isinstance(bound.value, (bool, int, float))):
                    self.inline_consts[ssa] = repr(bound.value)  # a default or literal: its text in a condition
                if isinstance(bound, (Const, Sym)) and not isinstance(getattr(bound, "value", None), (str, bool)):
                    self.kinds[ssa] = "scalar"
                env[param.arg] = ssa
        saved_via = self.via
        self.via = (*self.via, self.src.pos(e))
        self.inline_stack.append(key)
        self.caller_envs.append(dict(scope.env))
        caller_fx = self.fx
        token = None
        if owner is not caller_fx:  # a method inherited from a class of another file: read in that file
            self.fx, self.src, self.positions = owner, owner.src, owner.src.positions
            token = _SOURCE.set(owner.src)
        try:
            try:
                self.block(fn.body, callee_scope, guard)
            except _Terminated:
                pass
        finally:
            if token is not None:
                _SOURCE.reset(token)
                self.fx, self.src, self.positions = caller_fx, caller_fx.src, caller_fx.src.positions
            self.inline_stack.pop()
            self.caller_envs.pop()
            self.via = saved_via
        returns = callee_scope.returns
        if not returns:
            return _const(None)
        if len(returns) == 1:
            return returns[0][0]
        inputs: list[Operand] = []
        for value, ret_guard in returns:
            if isinstance(value, Var):
                inputs.append(value)
            else:
                tmp = self.emit("op", "assign", (value,), (), ret_guard, e)
                inputs.append(_VARS[tmp[0]])
        out = self.fresh(f"_{fn.name}")
        self.generated.add(out)
        self.nodes.append(_new_node("phi", "phi", tuple(inputs), (), (out,), None, guard, None, self.via))
        return _VARS[out]


MODULE_CLASS = "__module__"
TOPLEVEL = "__toplevel__"


def _is_bare_super(e: ast.AST) -> bool:
    """`super()`, with no arguments."""
    return isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "super" and not e.args \
        and not e.keywords


def _calls_something(stmt: ast.stmt) -> bool:
    todo: list[ast.AST] = [stmt]  # `_walk`, stopping at the first call
    append = todo.append
    for node in todo:
        if isinstance(node, _Call):
            return True
        for name in node._fields:
            try:
                value = getattr(node, name)
            except AttributeError:
                continue
            if isinstance(value, _AST):
                append(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, _AST):
                        append(item)
    return False


def _parenthesize(text: str) -> str:
    simple = text.replace(".", "").replace("_", "").isalnum()
    return text if simple or (text.startswith("(") and text.endswith(")")) else f"({text})"


_Name, _Constant, _Attribute, _Call = ast.Name, ast.Constant, ast.Attribute, ast.Call
_BinOp, _Subscript, _Tuple, _List = ast.BinOp, ast.Subscript, ast.Tuple, ast.List
_AST = ast.AST
_BLOCK_ITEMS = (ast.stmt, ast.excepthandler, ast.match_case)
_MAY_NAME_A_LAYER = {ast.Name, ast.Attribute, ast.Subscript}  # what `layer_target` can resolve
# in-place tensor methods read as their out-of-place form where the tensor has no alias
# (`_MethodExtractor.in_place_fill`): the fill keeps the tensor's dtype either way
_IN_PLACE = {"masked_fill_": "masked_fill"}
# in-place arithmetic read as its operator (`s.mul_(x)` as `s * x`), only with one operand and no
# keyword (`add_(y, alpha=2)` stays in place); with a tensor of a wider dtype the in-place result keeps
# the narrower one, which the operator widens: a rounding difference, not another value
_IN_PLACE_OPERATORS = {"mul_": ast.Mult, "div_": ast.Div, "add_": ast.Add, "sub_": ast.Sub}
# ops whose result is a tensor of its own, never a view of an operand
_FRESH_TENSOR = {"matmul", "add", "sub", "mul", "div", "scale", "neg", "masked_fill", "torch.cat", "torch.where",
                 "torch.baddbmm", "softmax"}  # (not an einsum: `torch.einsum('ij->ji', x)` is a view of x)
# ops whose result may share its operand's storage (a view): an in-place fill of it fills the operand too
_VIEWS = {".view", ".reshape", ".unflatten", ".flatten", "transpose", ".permute", ".unsqueeze", ".squeeze"}
_METADATA_READS = {"shape", "dtype", "device", "ndim", "is_cuda", "requires_grad", "layout"}


def _reads_metadata(node: Node) -> bool:
    if node.op in (".size", ".dim", ".numel", "len"):
        return True
    return node.op == "getattr" and len(node.inputs) == 2 and type(node.inputs[1]) is Const \
        and node.inputs[1].value in _METADATA_READS


def _mentions(operand: Operand, name: str) -> bool:
    if type(operand) is Var:
        return operand.name == name
    return type(operand) is Seq and any(_mentions(item, name) for item in operand.items)


def _is_scripted(fn: ast.FunctionDef) -> bool:
    """`@torch.jit.script` functions are compiled on their own: their body is read at each Python
    call (`inline`), where a rewrite is written; the function itself is no site."""
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr in ("script", "script_if_tracing"):
            return True
    return False


def _binds_otherwise(info: ClassInfo, name: str) -> bool:
    """The class body binds `name` by something other than a `def` (`get_scores = other`)."""
    return any(not isinstance(stmt, ast.FunctionDef) and name in _bound_names(stmt) for stmt in info.node.body)


def _bound_names(stmt: ast.stmt) -> list[str]:
    """The names a module-level statement other than a `def` binds there: its assignment targets,
    imports, class, or (conservatively) any name stored anywhere in a compound statement."""
    if isinstance(stmt, (ast.ClassDef, ast.AsyncFunctionDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).partition(".")[0] for a in stmt.names]
    if isinstance(stmt, (ast.Expr, ast.Pass)):
        return []
    return [n.id for n in _walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)] + \
        [n.name for n in _walk(stmt) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _wraps_itself(stmt: ast.stmt, name: str) -> bool:
    """`name = wrapper(name)`: the function wrapped, as a decorator does (`rms_norm = compile(rms_norm)`)."""
    return isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
        and stmt.targets[0].id == name and isinstance(stmt.value, ast.Call) and len(stmt.value.args) == 1 \
        and not stmt.value.keywords and isinstance(stmt.value.args[0], ast.Name) and stmt.value.args[0].id == name


def _with_outputs(node: Node, outputs: tuple[str, ...]) -> Node:
    """`node` with other outputs. Only for a node that extraction has just made and that nothing
    else refers to yet: then it is renamed in place (it is not hashed or shared before)."""
    if _set_outputs is not None:
        _set_outputs(node, outputs)
        return node
    return Node(node.kind, node.op, node.inputs, node.kwargs, outputs, node.target, node.guard, node.pos, node.via)


_set_outputs = Node.__dict__["outputs"].__set__ if _new_node is not Node else None  # the slot descriptor


def _uniform(items: tuple[LayerDef, ...]) -> bool:
    return len({i.type for i in items}) == 1


def _einsum_labels(equation: str, einops: bool) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None:
    """The labels of a two-operand einsum's operands and output, each at least two, or None."""
    lhs, arrow, out = equation.partition("->")
    parts = lhs.split(",")
    if not arrow or len(parts) != 2:
        return None
    a, b, o = (C.einsum_axes(p, einops) for p in (parts[0], parts[1], out))
    if a is None or b is None or o is None or min(len(a), len(b), len(o)) < 2:
        return None
    return a, b, o


def _einsum_product(equation: str, einops: bool = False) -> tuple[bool, bool, bool] | None:
    """How the two-operand einsum `equation` is a batched matrix product, as (transpose the first
    operand, transpose the second, first operand on the left): the same batch labels in the same
    order on both operands and the output, then each operand's last two labels share exactly one
    label (contracted), and the output's last two are the other two in either order. So
    `bhid,bhjd->bhij` is `a @ b^T`, `bhdi,bhdj->bhij` (channels-first) is `a^T @ b`, and
    `bhij,bhjd->bhdi` (output read back channels-first) is `b^T @ a^T`."""
    labels = _einsum_labels(equation, einops)
    if labels is None:
        return None
    a, b, o = labels
    batch = a[:-2]
    if b[:-2] != batch or o[:-2] != batch or len(set(a)) != len(a) or len(set(b)) != len(b) or len(set(o)) != len(o):
        return None
    a2, b2, o2 = a[-2:], b[-2:], o[-2:]
    if "..." in a2 or "..." in b2 or "..." in o2 or any(x in batch for x in (*a2, *b2, *o2)):
        return None
    shared = set(a2) & set(b2)
    if len(shared) != 1:
        return None
    x = shared.pop()
    i = a2[0] if a2[1] == x else a2[1]
    j = b2[0] if b2[1] == x else b2[1]
    if i == j or x in o2:
        return None
    if o2 == (i, j):
        return (a2 == (x, i), b2 == (j, x), True)  # (batch, i, x) @ (batch, x, j)
    if o2 == (j, i):
        return (a2 == (i, x), b2 == (x, j), False)  # (batch, j, x) @ (batch, x, i)
    return None


def _einsum_lowering(equation: str, einops: bool = False) -> tuple | None:
    """How a two-operand einsum that `_einsum_product` does not take is still a batched matrix
    product: the contracted labels (on both operands, not in the output) in the same order on both,
    every other label in the output, each operand with a row label of its own (`i` on the left, `j`
    on the right), and the rest batch labels, in any order, possibly missing from one operand (it
    broadcasts there). The product runs over the batch labels in the output's order, as
    ((a's permute, a's new axes, a's flattened runs, swap a's last two), (the same for b), the right
    operand's row labels' positions in b where there are several, the result's permute or None):
    `bihd,bjhd->bhij` permutes both operands to (b, h, ., d); `b h i d, b j d -> b h i j` gives the
    key a size-1 head axis. Several contracted labels are one feature axis: each operand is permuted
    to bring them together after (or before) its row and they are flattened
    (`bhtcfn,bhtefn->bhce` contracts (t f n)); several row labels of the right operand are one
    too, flattened and unflattened after the product (a value with trailing axes carried to the
    output, `b h i j, b h j w d -> b h i w d`). Contracted labels in another order on the two
    operands are not one axis: None. Of several row candidates of the left operand the ones that
    leave the output in place win; the others are batch labels (`bnhk,bmk->bnhm` is a product per
    (b, n) of h rows); of the right operand's, those the output places before the last label both
    operands share are batch labels too (`b h i d, c h j d -> b c h i j`). None when the equation is
    not such a product (a trace, a label summed out of one operand, `...`)."""
    labels = _einsum_labels(equation, einops)
    if labels is None:
        return None
    a, b, o = labels
    if "..." in a or "..." in b or "..." in o or any(len(set(t)) != len(t) for t in (a, b, o)):
        return None
    xs = [label for label in a if label in b and label not in o]
    if not xs or xs != [label for label in b if label in a and label not in o] or set(o) - set(a) - set(b):
        return None
    if set(a) - set(o) - set(xs) or set(b) - set(o) - set(xs):
        return None
    rows_a = [label for label in o if label in a and label not in b]
    rows_b = [label for label in b if label in o and label not in a]
    if not rows_a or not rows_b:
        return None
    i = o[-2] if o[-2] in rows_a and o[-1] in rows_b else rows_a[-1]
    shared = [k for k, label in enumerate(o) if label in a and label in b]
    among = [label for label in rows_b if shared and o.index(label) < shared[-1]]
    if among and len(among) < len(rows_b):
        # a label of the right operand alone that the output places among the labels of both
        # operands' batch, before the last of them, is a batch label missing from the left operand
        # (enformer's every query sequence against every context, `b h i d, c h j d -> b c h i j`)
        rows_b = [label for label in rows_b if label not in among]
    batch = [label for label in o if label != i and label not in rows_b]

    def plan(own: tuple[str, ...], rows: list[str]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...], bool]:
        present = [own.index(label) for label in batch if label in own]
        first = [own.index(label) for label in (*rows, *xs)]
        second = [own.index(label) for label in (*xs, *rows)]
        # the tail in the operand's own order where it has one, else the order moving fewer axes
        if max(first[:len(rows)]) < min(first[len(rows):]) or min(first[:len(rows)]) > max(first[len(rows):]):
            rows_first = first[0] < second[0]
        else:
            moved_first = sum(1 for k, d in enumerate((*present, *first)) if k != d)
            moved_second = sum(1 for k, d in enumerate((*present, *second)) if k != d)
            rows_first = moved_first <= moved_second
        order = tuple(present + (first if rows_first else second))
        missing = tuple(p for p, label in enumerate(batch) if label not in own)
        runs: list[tuple[int, int]] = []
        start = len(batch)
        for group in ((rows, xs) if rows_first else (xs, rows)):
            if len(group) > 1:
                runs.append((start, start + len(group) - 1))
            start += len(group)
        return order, missing, tuple(runs), not rows_first

    a_plan = plan(a, [i])
    b_plan = plan(b, rows_b)
    b_plan = (b_plan[0], b_plan[1], b_plan[2], not b_plan[3])  # the right operand enters as (batch..., x, j)
    result = (*batch, i, *rows_b)
    unflat = tuple(b.index(label) for label in rows_b) if len(rows_b) > 1 else ()
    out_perm = None if tuple(o) == result else tuple(result.index(label) for label in o)
    return a_plan, b_plan, unflat, out_perm


def _swaps_last_two(dims: tuple[Operand, ...]) -> bool:
    """`permute(0, 1, ..., n-1, n-2)` (every dimension listed, the last two swapped)."""
    if len(dims) == 1 and isinstance(dims[0], Const) and isinstance(dims[0].value, tuple):
        values = dims[0].value
    elif dims and all(isinstance(d, Const) for d in dims):
        values = tuple(d.value for d in dims)  # type: ignore[union-attr]
    else:
        return False
    n = len(values)
    if n < 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return False
    return list(values) == [*range(n - 2), n - 1, n - 2]


def _normalize_signature(op: str, inputs: tuple[Operand, ...], kwargs: tuple[tuple[str, Operand], ...]
                         ) -> tuple[tuple[Operand, ...], tuple[tuple[str, Operand], ...]]:
    """Positional parameters of a canonical op become keywords (`softmax(x, -1)` ->
    `softmax(x, dim=-1)`); transpose's two dims are put in a fixed order."""
    names = C.SIGNATURES.get(op)
    if names is None:
        return inputs, kwargs
    arity = C.TENSOR_ARITY.get(op, 1)
    tensors, rest = inputs[:arity], inputs[arity:]
    if len(rest) > len(names):
        return inputs, kwargs
    positional = tuple(zip(names, rest, strict=False))
    merged = (*positional, *kwargs)
    if op in C.SYMMETRIC_DIMS:
        dims = dict(merged)
        a, b = dims.get("dim0"), dims.get("dim1")
        if isinstance(a, Const) and isinstance(b, Const) and isinstance(a.value, int) and isinstance(b.value, int) \
                and a.value > b.value:
            low, high = b, a
            merged = tuple((k, low if k == "dim0" else high if k == "dim1" else v) for k, v in merged)
    return tensors, merged


def _names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for elt in target.elts for n in _names(elt)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []


_IDENT = re.compile(r"(?<![.\w])[A-Za-z_]\w*(?!\s*=[^=])")


def _has_data(e: Any, scope: _Scope) -> bool:
    """Whether an expression reads any tracked value (a parameter or local of the method).

    The common shapes (names, attribute chains, constants, calls, operators, subscripts, tuples)
    are decided structurally; anything else on its source text (identifiers not preceded by a dot
    and not keyword argument names), which is cheaper than walking the subtree. A name inside a
    string literal can give a false "yes": the expression is then unchained into nodes instead of
    kept as one symbol, which changes no data flow.

    Names and attribute chains below a call or an operator are decided in place (no call per
    operand): this runs for every subexpression that `expr` unchains."""
    t = type(e)
    if t is _Name:
        return e.id in scope.env or e.id in scope.layers  # type: ignore[attr-defined]
    if t is _Constant:
        return False
    if t is _Attribute:
        return _attribute_has_data(e, scope)
    if t is _Call:
        env, layers = scope.env, scope.layers
        func = e.func  # type: ignore[attr-defined]
        tf = type(func)
        if tf is _Attribute:
            if _attribute_has_data(func, scope):
                return True
        elif tf is _Name:
            if func.id in env or func.id in layers:
                return True
        elif _has_data(func, scope):
            return True
        for arg in e.args:  # type: ignore[attr-defined]
            ta = type(arg)
            if ta is _Name:
                if arg.id in env or arg.id in layers:
                    return True
            elif ta is not _Constant and _has_data(arg, scope):
                return True
        for kw in e.keywords:  # type: ignore[attr-defined]
            value = kw.value
            ta = type(value)
            if ta is _Name:
                if value.id in env or value.id in layers:
                    return True
            elif ta is not _Constant and _has_data(value, scope):
                return True
        return False
    if t is _BinOp:
        for side in (e.left, e.right):  # type: ignore[attr-defined]
            ts = type(side)
            if ts is _Name:
                if side.id in scope.env or side.id in scope.layers:
                    return True
            elif ts is not _Constant and _has_data(side, scope):
                return True
        return False
    if t is _Subscript:
        return _has_data(e.value, scope) or _has_data(e.slice, scope)  # type: ignore[attr-defined]
    if t is _Tuple or t is _List:
        for item in e.elts:  # type: ignore[attr-defined]
            if _has_data(item, scope):
                return True
        return False
    if t is ast.UnaryOp:
        return _has_data(e.operand, scope)  # type: ignore[attr-defined]
    if t is ast.Starred:
        return _has_data(e.value, scope)  # type: ignore[attr-defined]
    if t is ast.Compare:
        if _has_data(e.left, scope):  # type: ignore[attr-defined]
            return True
        return any(_has_data(c, scope) for c in e.comparators)  # type: ignore[attr-defined]
    if t is ast.BoolOp:
        return any(_has_data(v, scope) for v in e.values)  # type: ignore[attr-defined]
    if t is ast.IfExp:
        return _has_data(e.test, scope) or _has_data(e.body, scope) or _has_data(e.orelse, scope)  # type: ignore[attr-defined]
    if t is ast.Slice:
        return any(part is not None and _has_data(part, scope) for part in (e.lower, e.upper, e.step))  # type: ignore[attr-defined]
    env = scope.env
    layers = scope.layers
    for name in _IDENT.findall(_SOURCE.get().raw(e)):
        if name in env or name in layers:
            return True
    return False


def _attribute_has_data(e: Any, scope: _Scope) -> bool:
    """`_has_data` of an attribute chain (`self.weight`, `x.shape`, `config.hidden_size`)."""
    tensors = scope.tensors
    while True:
        value = e.value
        tv = type(value)
        if tv is _Name:
            if tensors and value.id == "self" and f"self.{e.attr}" in tensors:  # type: ignore[attr-defined]
                return True
            return value.id in scope.env or value.id in scope.layers  # type: ignore[attr-defined]
        if tv is not _Attribute:
            return _has_data(value, scope)
        e = value  # type: ignore[assignment]


def _data_names(e: ast.AST, scope: _Scope) -> list[str]:
    """Tracked names an expression reads, in the order of `ast.walk` (breadth first), which is
    walked here without its generators."""
    env = scope.env
    seen: dict[str, None] = {}
    todo = [e]
    append = todo.append
    for node in todo:  # grows while it is walked: breadth first, like ast.walk
        if isinstance(node, _Name) and node.id in env:
            seen.setdefault(node.id, None)
        for name in node._fields:
            try:
                value = getattr(node, name)
            except AttributeError:
                continue
            if isinstance(value, _AST):
                append(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, _AST):
                        append(item)
    return list(seen)


def _qualify(names: dict[str, str], expr: Any) -> str | None:
    """`engine.extract.imports.qualify_chain(expr, names)`, compiled with the extractor (it runs for
    every call and every layer built)."""
    attrs: list[str] = []
    while isinstance(expr, _Attribute):
        attrs.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, _Name):
        return None
    head = names.get(expr.id, expr.id)
    return head + "." + ".".join(reversed(attrs)) if attrs else head


def _walk(e: ast.AST) -> list[ast.AST]:
    """The nodes of `e`'s subtree, breadth first like `ast.walk` (which is not compiled: this runs
    for every condition of an inlined helper)."""
    todo: list[ast.AST] = [e]
    for node in todo:  # grows while it is walked
        _add_children(node, todo)
    return todo


def _add_children(node: ast.AST, todo: list[ast.AST]) -> None:
    """Append the child nodes of `node` to `todo`, in the order of `ast.iter_child_nodes`."""
    for name in node._fields:
        try:
            value = getattr(node, name)
        except AttributeError:
            continue
        if isinstance(value, _AST):
            todo.append(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, _AST):
                    todo.append(item)


def _renamed(text: str, test: ast.expr, renames: dict[str, str]) -> str:
    """`text` (the source of `test`) with the names in `renames` replaced where they occur."""
    lines = text.split("\n")
    edits: list[tuple[int, int, int, str]] = []
    for node in _walk(test):
        if isinstance(node, ast.Name) and node.id in renames and node.end_col_offset is not None:
            row = node.lineno - test.lineno
            if row >= len(lines) or not lines[row].isascii():
                return HELPER_CONDITION + text
            shift = test.col_offset if row == 0 else 0
            edits.append((row, node.col_offset - shift, node.end_col_offset - shift, node.id))
    for row, start, end, old in sorted(edits, reverse=True):
        line = lines[row]
        if line[start:end] != old:
            return HELPER_CONDITION + text
        lines[row] = line[:start] + renames[old] + line[end:]
    return "\n".join(lines)
