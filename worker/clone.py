"""Shallow clone of one commit over HTTPS with an installation token.

The token reaches only the ``git fetch`` process, through its environment (not the command line,
not the URL, not ``.git/config``); the checkout it leaves behind holds no credential. Nothing from
the repository runs here: no hooks, no submodules, no LFS filters, and symbolic links are checked
out as plain files so that reading the tree can never follow a link out of it.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

TRANSIENT_MARKERS = (
    "could not resolve host",
    "failed to connect",
    "connection refused",
    "connection reset",
    "connection timed out",
    "operation timed out",
    "the requested url returned error: 5",
    "the requested url returned error: 429",
    "early eof",
    "rpc failed",
    "unexpected disconnect",
)


class CloneError(RuntimeError):
    def __init__(self, message: str, *, transient: bool):
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Checkout:
    path: Path
    sha: str


@dataclass(frozen=True)
class TreeSize:
    files: int
    bytes: int


def _git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    home = tempfile.gettempdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_LFS_SKIP_SMUDGE": "1",
        "GIT_ASKPASS": "/bin/false",
    }
    env.update(extra or {})
    return env


def _run(args: list[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, env=env or _git_env(), capture_output=True,
                              text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise CloneError(f"git {args[0]} took longer than {timeout:.0f} s", transient=True) from None
    if done.returncode != 0:
        stderr = done.stderr.strip()
        transient = any(marker in stderr.lower() for marker in TRANSIENT_MARKERS)
        raise CloneError(f"git {args[0]} failed: {stderr[-800:]}", transient=transient)
    return done.stdout.strip()


def auth_env(token: str) -> dict[str, str]:
    """Git config, through the environment, that sends the token as GitHub expects for Apps."""
    basic = base64.b64encode(f"x-access-token:{token}".encode()).decode()
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: Basic {basic}",
    }


def head_of(path: Path) -> str | None:
    if not (path / ".git").is_dir():
        return None
    try:
        return _run(["rev-parse", "HEAD"], cwd=path, timeout=30)
    except CloneError:
        return None


def shallow_clone(url: str, dest: Path, *, token: str | None, ref: str, sha: str | None,
                  timeout: float) -> Checkout:
    """Fetch one commit (``sha``, or the tip of ``ref``) at depth 1 into ``dest``, replacing it.

    A checkout already at ``sha`` is reused: a retried task does not clone twice.
    """
    if sha and head_of(dest) == sha:
        return Checkout(dest, sha)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _run(["init", "-q"], cwd=dest, timeout=30)
    for key, value in (("core.symlinks", "false"), ("core.hooksPath", os.devnull),
                       ("submodule.recurse", "false"), ("protocol.allow", "never"),
                       ("protocol.https.allow", "always"), ("protocol.http.allow", "always")):
        _run(["config", key, value], cwd=dest, timeout=30)
    env = _git_env(auth_env(token) if token else None)
    target = sha or f"refs/heads/{ref}"
    _run(["fetch", "--quiet", "--depth=1", "--no-tags", "--no-recurse-submodules", url, target],
         cwd=dest, timeout=timeout, env=env)
    _run(["checkout", "--quiet", "--detach", "FETCH_HEAD"], cwd=dest, timeout=timeout)
    return Checkout(dest, _run(["rev-parse", "HEAD"], cwd=dest, timeout=30))


def tree_size(root: Path, *, stop_after_files: int) -> TreeSize:
    """Files and bytes of the working tree (``.git`` excluded); stops counting past the limit."""
    files = size = 0
    for directory, subdirs, names in os.walk(root):
        if directory == str(root) and ".git" in subdirs:
            subdirs.remove(".git")
        for name in names:
            files += 1
            size += os.lstat(os.path.join(directory, name)).st_size
        if files > stop_after_files:
            break
    return TreeSize(files, size)
