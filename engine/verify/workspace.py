"""Temporary working copies: the original tree, and the original with rewritten files laid over it.

Repository code never runs in place. Each side gets its own copy (the harness's repository, or for
a Hugging Face-style package the whole top-level package, e.g. ``transformers``), so that a child
that writes files changes nothing outside its copy and an installed package is never edited.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from engine.verify.targets import HFTarget, Target

_IGNORE = shutil.ignore_patterns(
    ".git", "__pycache__", "*.pyc", ".venv", "venv", ".tox", "node_modules", ".mypy_cache", ".pytest_cache",
    ".ruff_cache", ".adopter",
)


def _safe_relpath(rel: str) -> PurePosixPath:
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ValueError(f"rewritten file path must be relative and inside the tree: {rel!r}")
    return path


def overlay_from(original_root: Path, rewritten: dict[str, str] | Path) -> dict[str, str]:
    """Rewritten files as ``{relative path: new text}``; a rewritten tree is reduced to the files
    that differ from (or are missing in) the original."""
    if isinstance(rewritten, dict):
        return {str(_safe_relpath(rel)): text for rel, text in rewritten.items()}
    rewritten = Path(rewritten)
    overlay: dict[str, str] = {}
    for path in sorted(rewritten.rglob("*")):
        if not path.is_file() or any(part in {".git", "__pycache__"} for part in path.parts):
            continue
        rel = path.relative_to(rewritten)
        original = Path(original_root) / rel
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if not original.is_file() or original.read_text(errors="replace") != text:
            overlay[rel.as_posix()] = text
    return overlay


@dataclass(frozen=True)
class Tree:
    """A working copy ready for a child: its working directory and its ``sys.path`` entries."""

    cwd: Path
    sys_path: tuple[str, ...]
    harness_root: Path  # what a harness target's paths are relative to


def materialize(original_root: Path, overlay: dict[str, str], dest: Path, target: Target) -> Tree:
    """Copy what ``target`` needs into ``dest`` and lay ``overlay`` over it."""
    original_root = Path(original_root).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    if isinstance(target, HFTarget):
        top = target.package_dir.resolve()
        site = dest / "site"
        copy_root = site / top.name
        shutil.copytree(top, copy_root, ignore=_IGNORE, symlinks=True)
        for rel, text in overlay.items():
            source = (original_root / _safe_relpath(rel)).resolve()
            if not source.is_relative_to(top):
                raise ValueError(f"rewritten file {rel} lies outside the package {top}")
            (copy_root / source.relative_to(top)).write_text(text)
        work = dest / "work"
        work.mkdir(exist_ok=True)
        return Tree(cwd=work, sys_path=(str(site),), harness_root=work)
    repo = dest / "repo"
    shutil.copytree(original_root, repo, ignore=_IGNORE, symlinks=True)
    for rel, text in overlay.items():
        path = repo / _safe_relpath(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Tree(cwd=repo, sys_path=(str(repo),), harness_root=repo)
