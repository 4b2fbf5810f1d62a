"""Reading, copying and writing a repository's files without ever leaving the repository.

A repository is untrusted input: a symlink in it may point anywhere (``model.py -> /etc/shadow``,
``src -> /``), and a tree may be arbitrarily deep or large. Everything here walks with
``os.scandir`` without following links, opens files with ``O_NOFOLLOW`` and stops at bounds:

- ``walk_files``: regular files under a root, links never followed (a link to a file inside the
  repository is skipped, its target is found on its own path; one pointing outside is reported);
- ``read_inside``: a file's bytes, refusing a link anywhere on its path;
- ``copy_tree``: a copy for verification in which links to files inside the repository become
  plain files and all other links are dropped;
- ``check_writable`` / ``write_inside``: ``--apply`` refuses to write through a link.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

MAX_FILES = 50_000  # files visited in one walk (the service's ADOPTER_MAX_FILES default)
MAX_DEPTH = 64  # folders below the root


class UnsafePath(ValueError):
    """A path that leaves the repository or goes through a link."""


class WalkLimit(ValueError):
    """The tree is larger or deeper than a walk may go."""


@dataclass
class Walk:
    files: list[Path] = field(default_factory=list)
    outside_links: list[str] = field(default_factory=list)  # relative paths of links leaving the root
    skipped_deep: list[str] = field(default_factory=list)  # folders past MAX_DEPTH, not entered
    truncated: bool = False  # stopped at max_files


def _points_inside(link: Path, root: Path) -> bool:
    try:
        return Path(os.path.realpath(link)).is_relative_to(root)
    except (OSError, ValueError):
        return False


def walk_files(root: Path, *, skip_dir=lambda name: False, keep_file=lambda name: True,
               max_files: int = MAX_FILES, max_depth: int = MAX_DEPTH) -> Walk:
    """Regular files under ``root`` in sorted order, without following any link."""
    root = Path(root).resolve()
    walk = Walk()
    stack: list[tuple[Path, int]] = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name, reverse=True)
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                if not _points_inside(path, root):
                    walk.outside_links.append(path.relative_to(root).as_posix())
                continue
            if entry.is_dir(follow_symlinks=False):
                if skip_dir(entry.name):
                    continue
                if depth + 1 > max_depth:
                    walk.skipped_deep.append(path.relative_to(root).as_posix())
                    continue
                stack.append((path, depth + 1))
            elif entry.is_file(follow_symlinks=False) and keep_file(entry.name):
                if len(walk.files) >= max_files:
                    walk.truncated = True
                    return walk
                walk.files.append(path)
    walk.files.sort()
    return walk


def _open_nofollow(root: Path, rel: PurePosixPath, flags: int, mode: int = 0o644) -> int:
    """Open ``root/rel`` component by component, refusing any link on the way (no races with a
    link swapped in between a check and the open)."""
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise UnsafePath(f"{rel}: not a path inside the repository")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in rel.parts[:-1]:
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if os.path.islink(os.path.join(root, *rel.parts[: rel.parts.index(part) + 1])):
                    raise UnsafePath(f"{rel}: {part} is a symbolic link") from None
                raise exc
            os.close(fd)
            fd = next_fd
        try:
            return os.open(rel.parts[-1], flags | os.O_NOFOLLOW, mode, dir_fd=fd)
        except OSError as exc:
            if os.path.islink(root / rel):
                raise UnsafePath(f"{rel}: is a symbolic link") from None
            raise exc
    finally:
        os.close(fd)


def read_inside(root: Path, rel: str | PurePosixPath) -> bytes:
    fd = _open_nofollow(Path(root), PurePosixPath(rel), os.O_RDONLY)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise UnsafePath(f"{rel}: not a regular file")
        return handle.read()


def check_writable(root: Path, rel: str) -> None:
    """Raise ``UnsafePath`` when writing ``root/rel`` would go through a link or leave ``root``."""
    path = PurePosixPath(rel)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise UnsafePath(f"{rel}: not a path inside the repository")
    current = Path(root)
    for part in path.parts:
        current = current / part
        if current.is_symlink():
            raise UnsafePath(f"{rel}: {current.relative_to(root)} is a symbolic link; refusing to write through it")


def write_inside(root: Path, rel: str, text: str) -> None:
    check_writable(root, rel)
    fd = _open_nofollow(Path(root), PurePosixPath(rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def copy_tree(source: Path, dest: Path, *, ignore: tuple[str, ...] = (), max_files: int = MAX_FILES,
              max_depth: int = MAX_DEPTH) -> list[str]:
    """Copy ``source`` to ``dest`` with no link in the copy: a link to a file inside ``source``
    becomes that file's content, every other link (outside, or to a folder) is dropped. Returns the
    relative paths of the dropped links; raises ``WalkLimit`` past the bounds."""
    source = Path(source).resolve()
    dropped: list[str] = []
    count = 0
    stack: list[tuple[Path, Path, int]] = [(source, Path(dest), 0)]
    while stack:
        folder, target, depth = stack.pop()
        target.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(folder):
            if any(fnmatch(entry.name, pattern) for pattern in ignore):
                continue
            path, out = Path(entry.path), target / entry.name
            if entry.is_symlink():
                real = Path(os.path.realpath(path))
                if real.is_relative_to(source) and real.is_file():
                    shutil.copyfile(real, out)
                    count += 1
                else:
                    dropped.append(path.relative_to(source).as_posix())
            elif entry.is_dir(follow_symlinks=False):
                if depth + 1 > max_depth:
                    raise WalkLimit(f"{path.relative_to(source)}: more than {max_depth} folders deep")
                stack.append((path, out, depth + 1))
            elif entry.is_file(follow_symlinks=False):
                shutil.copyfile(path, out, follow_symlinks=False)
                count += 1
            if count > max_files:
                raise WalkLimit(f"more than {max_files} files to copy")
    return dropped
