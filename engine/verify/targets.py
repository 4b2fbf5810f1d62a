"""What to build to check a rewrite: a repository's harness, or Hugging Face-style model classes.

Nothing here imports repository code: the harness is read from the repository's config file and
the Hugging Face model classes are found by reading the modeling file's syntax tree.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from engine.config import CONFIG_FILES, ConfigError, load_config  # noqa: F401 - re-exported

DEFAULT_SHAPES = ({"batch_size": 2, "seq_len": 16}, {"batch_size": 1, "seq_len": 7})


@dataclass(frozen=True)
class HarnessTarget:
    """``harness: path/inside/repo.py:build`` in the repository's config file."""

    module: str  # path of the harness file, relative to the repository root
    function: str = "build"
    shapes: tuple[dict, ...] = DEFAULT_SHAPES  # keyword arguments build() is called with (those it accepts)
    bench_shape: dict | None = None  # keyword arguments for the benchmark

    @property
    def label(self) -> str:
        return f"{self.module}:{self.function}"

    def spec(self, root: Path) -> dict:
        return {"kind": "harness", "root": str(root), "module": self.module, "function": self.function}


@dataclass(frozen=True)
class HFTarget:
    """One model class of a Hugging Face-style package, built from a small config."""

    package_dir: Path  # the top-level package folder (``.../site-packages/transformers``)
    module: str  # dotted module of the modeling file (``transformers.models.bert.modeling_bert``)
    model_class: str  # ``BertModel``
    shapes: tuple[dict, ...] = DEFAULT_SHAPES
    bench_shape: dict | None = None
    config_overrides: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.module}.{self.model_class}"

    def spec(self, root: Path) -> dict:  # root unused: the package is found on sys.path
        return {"kind": "hf", "module": self.module, "model_class": self.model_class,
                "config_overrides": dict(self.config_overrides)}


Target = Union[HarnessTarget, HFTarget]


# --------------------------------------------------------------------------------------------------
# The repository's config file


def load_repo_config(root: Path) -> tuple[Path | None, dict]:
    """The first config file found under ``root`` and its settings (``(None, {})`` if none), read
    and validated by ``engine.config`` (the reader the command line and the App share)."""
    config, source = load_config(root)
    if source is None:
        return None, {}
    return root / source, config.to_dict()


def _shape_list(value, where: str) -> tuple[dict, ...]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value) or not value:
        raise ConfigError(f"{where}: expected a non-empty list of mappings")
    return tuple(dict(item) for item in value)


def harness_target(root: Path) -> HarnessTarget | None:
    path, data = load_repo_config(root)
    harness = data.get("harness")
    if harness is None:
        return None
    if isinstance(harness, str):
        harness = {"build": harness}
    if not isinstance(harness, dict) or not isinstance(harness.get("build"), str):
        raise ConfigError(f"{path.name}: harness must be 'file.py:function' or a mapping with 'build'")
    module, _, function = harness["build"].partition(":")
    module_path = (root / module).resolve()
    if not module.endswith(".py") or not module_path.is_relative_to(root.resolve()):
        raise ConfigError(f"{path.name}: harness file {module!r} must be a .py file inside the repository")
    shapes = _shape_list(harness["shapes"], "harness.shapes") if "shapes" in harness else DEFAULT_SHAPES
    bench = harness.get("bench")
    if bench is not None and not isinstance(bench, dict):
        raise ConfigError(f"{path.name}: harness.bench must be a mapping of build() arguments")
    return HarnessTarget(module=module, function=function or "build", shapes=shapes, bench_shape=bench)


# --------------------------------------------------------------------------------------------------
# Hugging Face-style packages


def package_top(path: Path) -> Path | None:
    """The top-level package folder containing ``path`` (a folder), or None outside packages."""
    path = path.resolve()
    if not (path / "__init__.py").is_file():
        return None
    while (path.parent / "__init__.py").is_file():
        path = path.parent
    return path


def _class_bases(tree: ast.Module) -> dict[str, list[str]]:
    bases: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases[node.name] = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
    return bases


def _is_config_dir(folder: Path) -> bool:
    for config_file in folder.glob("configuration_*.py"):
        try:
            tree = ast.parse(config_file.read_text())
        except SyntaxError:
            continue
        if any(isinstance(n, ast.ClassDef) and n.name.endswith("Config") for n in tree.body):
            return True
    return False


def _changed_lines(original: str, rewritten: str) -> set[int]:
    lines: set[int] = set()
    matcher = difflib.SequenceMatcher(a=original.splitlines(), b=rewritten.splitlines(), autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":
            lines.update(range(i1 + 1, max(i2, i1 + 1) + 1))
    return lines


_HEAD_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration",
                  "ForImageClassification", "ForSequenceClassification")

def affected_model_classes(source: str, changed: set[int] | None, limit: int = 2) -> list[str]:
    """``*PreTrainedModel`` subclasses in ``source`` whose code reaches a changed line.

    A class reaches another when it names it (as a base or anywhere in its body); changes outside
    every class (imports, module functions) reach all of them. The base model comes first, then a
    head model, up to ``limit``.
    """
    tree = ast.parse(source)
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    bases = _class_bases(tree)

    def is_model(name: str, seen=()) -> bool:
        if name in seen:
            return False
        return any(b.endswith("PreTrainedModel") and b != name or (b in bases and is_model(b, (*seen, name)))
                   for b in bases.get(name, []))

    models = [c.name for c in classes if is_model(c.name) and not c.name.endswith("PreTrainedModel")]
    if changed is None:
        touched = {c.name for c in classes}
    else:
        touched = {c.name for c in classes if any(c.lineno <= line <= c.end_lineno for line in changed)}
        outside = {line for line in changed if not any(c.lineno <= line <= c.end_lineno for c in classes)}
        if outside:
            touched = {c.name for c in classes}
    names_used = {c.name: {n.id for n in ast.walk(c) if isinstance(n, ast.Name)} for c in classes}
    reaches = set(touched)
    grew = True
    while grew:
        grew = False
        for c in classes:
            if c.name not in reaches and names_used[c.name] & reaches:
                reaches.add(c.name)
                grew = True
    hit = [m for m in models if m in reaches]

    def rank(name: str) -> tuple[int, int, int]:
        if name.endswith("Model") and "For" not in name and "Head" not in name:
            return (0, 0, hit.index(name))
        for index, suffix in enumerate(_HEAD_SUFFIXES):
            if name.endswith(suffix):
                return (1, index, hit.index(name))
        return (2, 0, hit.index(name))

    ordered = sorted(hit, key=rank)
    chosen: list[str] = []
    for name in ordered:  # one of each kind first: a base model and a head
        if rank(name)[0] < 2 and rank(name)[0] not in {rank(c)[0] for c in chosen}:
            chosen.append(name)
    chosen += [n for n in ordered if n not in chosen]
    return chosen[:limit]


def hf_targets(original_root: Path, overlay: dict[str, str], *, limit: int = 2,
               shapes: tuple[dict, ...] = DEFAULT_SHAPES) -> list[HFTarget]:
    targets: list[HFTarget] = []
    for rel in sorted(overlay):
        path = (original_root / rel).resolve()
        if path.suffix != ".py":
            continue
        top = package_top(path.parent)
        if top is None or not _is_config_dir(path.parent):
            continue
        modeling = [path] if path.name.startswith("modeling_") else sorted(path.parent.glob("modeling_*.py"))
        for model_file in modeling:
            if model_file.name.startswith(("modeling_tf_", "modeling_flax_")):
                continue
            original = model_file.read_text()
            changed = _changed_lines(original, overlay[rel]) if model_file == path and path.exists() else None
            dotted = ".".join(model_file.relative_to(top.parent).with_suffix("").parts)
            for name in affected_model_classes(original, changed, limit=limit):
                target = HFTarget(package_dir=top, module=dotted, model_class=name, shapes=shapes)
                if target not in targets:
                    targets.append(target)
    return targets


def discover_targets(original_root: Path, overlay: dict[str, str], *, hf_limit: int = 2) -> list[Target]:
    """The harness named in the repository's config file, else Hugging Face model classes."""
    original_root = Path(original_root)
    harness = harness_target(original_root)
    if harness is not None:
        return [harness]
    return list(hf_targets(original_root, overlay, limit=hf_limit))
