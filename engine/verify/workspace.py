"""Temporary working copies: the original tree, and the original with rewritten files laid over it.

Repository code never runs in place. Each side gets its own copy (the harness's repository, or for
a Hugging Face-style package the whole top-level package, e.g. ``transformers``), so that a child
that writes files changes nothing outside its copy and an installed package is never edited. The
copy holds no symbolic link (``engine.repo_files.copy_tree``): a link to a file inside the tree
becomes a plain file, any other is dropped, so neither the child nor the overlay written into
the copy can reach through one out of it.

Scratch folders (``scratch_dir``) carry their owner's pid and start time, so that a worker
process killed in the middle of a verification leaves nothing behind for long: the next worker
process removes folders whose owner is gone (``sweep_orphans``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from engine.repo_files import copy_tree, walk_files
from engine.verify.targets import HFTarget, Target

_IGNORE = (".git", "__pycache__", "*.pyc", ".venv", "venv", ".tox", "node_modules", ".mypy_cache", ".pytest_cache",
           ".ruff_cache", ".adopter")
_OWNER = ".adopter-owner"
SCRATCH_PREFIX = "adopter-"


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def scratch_dir(kind: str) -> Path:
    """A new temporary folder ``adopter-<kind>-...`` that names its owning process."""
    path = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{kind}-"))
    (path / _OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid())}")
    return path


def sweep_orphans(parent: Path | None = None) -> list[Path]:
    """Remove scratch folders whose owning process no longer runs (killed mid-verification)."""
    removed = []
    for path in Path(parent or tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
        try:
            pid, started = (path / _OWNER).read_text().split()
            alive = _start_time(int(pid)) == started
        except (OSError, ValueError):
            continue  # not ours, or being created
        if not alive:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


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
    rewritten = Path(rewritten).resolve()
    overlay: dict[str, str] = {}
    for path in walk_files(rewritten, skip_dir=lambda name: name in {".git", "__pycache__"}).files:
        rel = path.relative_to(rewritten)
        original = Path(original_root) / rel
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if original.is_symlink() or not original.is_file() or original.read_text(errors="replace") != text:
            overlay[rel.as_posix()] = text
    return overlay


@dataclass(frozen=True)
class Tree:
    """A working copy ready for a child: its working directory and its ``sys.path`` entries."""

    cwd: Path
    sys_path: tuple[str, ...]
    harness_root: Path  # what a harness target's paths are relative to
    root: Path  # the whole copy (what the child may write)
    dropped_links: tuple[str, ...] = ()  # links left out of the copy (outside the tree, or to folders)


def materialize(original_root: Path, overlay: dict[str, str], dest: Path, target: Target) -> Tree:
    """Copy what ``target`` needs into ``dest`` and lay ``overlay`` over it."""
    original_root = Path(original_root).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    if isinstance(target, HFTarget):
        top = target.package_dir.resolve()
        site = dest / "site"
        copy_root = site / top.name
        dropped = copy_tree(top, copy_root, ignore=_IGNORE)
        for rel, text in overlay.items():
            source = (original_root / _safe_relpath(rel)).resolve()
            if not source.is_relative_to(top):
                raise ValueError(f"rewritten file {rel} lies outside the package {top}")
            _write_plain(copy_root / source.relative_to(top), text)
        work = dest / "work"
        work.mkdir(exist_ok=True)
        return Tree(cwd=work, sys_path=(str(site),), harness_root=work, root=dest, dropped_links=tuple(dropped))
    repo = dest / "repo"
    dropped = copy_tree(original_root, repo, ignore=_IGNORE)
    for rel, text in overlay.items():
        path = repo / _safe_relpath(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_plain(path, text)
    return Tree(cwd=repo, sys_path=(str(repo),), harness_root=repo, root=dest, dropped_links=tuple(dropped))


def _write_plain(path: Path, text: str) -> None:
    """Write into the copy; it holds no links, and this makes sure no write ever goes through one."""
    if path.is_symlink():
        raise ValueError(f"{path}: a symbolic link in the working copy")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
