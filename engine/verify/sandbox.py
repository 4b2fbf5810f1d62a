"""Run untrusted repository code in a child process with limits.

Every model build (verification and benchmark alike) goes through here. The child gets:

- a scrubbed environment: only PATH, LANG/LC_*, a temporary HOME and TMPDIR, thread counts and the
  offline switches of the Hugging Face libraries; nothing else of the parent's environment (no
  tokens, no cloud credentials, no proxies) reaches it;
- ``python -I``: isolated mode, so PYTHON* variables, the user site directory and the script's own
  folder are not on ``sys.path``;
- a wall-clock limit (the whole process group is killed when it passes);
- a memory limit (``RLIMIT_AS``; not on CUDA, whose driver reserves far more address space than it
  uses, where only the time limit applies);
- no network where the platform allows: ``unshare -n`` gives the child an empty network namespace
  when we may create one (root, or user namespaces enabled); elsewhere the child runs with the
  network reachable and the result says so;
- a working directory of its own (the caller's temporary working copy).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Variables a child may inherit (values copied from the parent when set). Everything else is dropped.
_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 300.0
    memory_bytes: int | None = 6 * 1024**3
    threads: int | None = None  # torch intra-op threads in the child; None: torch's default
    network: bool = False  # allow network (never needed for verification)


@dataclass
class ChildRun:
    """What happened to one child process."""

    status: str  # "exited", "timeout", "killed" (a signal, e.g. the kernel's OOM killer)
    returncode: int | None
    elapsed_s: float
    stdout_tail: str
    stderr_tail: str
    network_isolated: bool

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.returncode == 0


def scrubbed_env(home: Path, *, threads: int | None = None, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: os.environ[key] for key in _PASSTHROUGH if key in os.environ}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HOME=str(home),
        TMPDIR=str(home),
        PYTHONHASHSEED="0",
        PYTHONDONTWRITEBYTECODE="1",
        # Hugging Face libraries must never try to download; their caches live in the temp HOME.
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    if extra:
        env.update(extra)
    return env


@functools.cache
def _unshare_prefix() -> tuple[str, ...]:
    unshare = shutil.which("unshare")
    if not unshare:
        return ()
    for prefix in ((unshare, "-n"), (unshare, "-r", "-n")):
        try:
            if subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0:
                return prefix
        except (OSError, subprocess.SubprocessError):
            continue
    return ()


def network_namespace_available() -> bool:
    """Whether ``unshare -n`` works here (root, or unprivileged user namespaces)."""
    return bool(_unshare_prefix())


def _limit_child(memory_bytes: int | None) -> None:  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def _tail(path: Path, limit: int = 8000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def python_command(script: Path, *args: str, network: bool = False) -> tuple[list[str], bool]:
    """The command line running ``script`` isolated; and whether the network is cut off."""
    prefix = () if network else _unshare_prefix()
    return [*prefix, sys.executable, "-I", str(script), *args], bool(prefix)


def popen(
    script: Path,
    args: list[str],
    *,
    cwd: Path,
    home: Path,
    limits: Limits,
    cuda: bool = False,
    stdin=None,
    stdout=None,
    stderr=None,
) -> tuple[subprocess.Popen, bool]:
    """Start ``script`` as a sandboxed child; the caller owns the process (see ``kill``)."""
    command, isolated = python_command(script, *args, network=limits.network)
    memory = None if cuda else limits.memory_bytes
    process = subprocess.Popen(
        command,
        cwd=str(cwd),
        env=scrubbed_env(home, threads=limits.threads),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # its own process group, so a timeout kills grandchildren too
        preexec_fn=functools.partial(_limit_child, memory),
        close_fds=True,
    )
    return process, isolated


def kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_child(
    script: Path, args: list[str], *, cwd: Path, home: Path, log_dir: Path, limits: Limits, cuda: bool = False
) -> ChildRun:
    """Run ``script`` to completion (or until the time limit) and report how it ended."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / "stdout.txt", log_dir / "stderr.txt"
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process, isolated = popen(
            script, args, cwd=cwd, home=home, limits=limits, cuda=cuda,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        )
        try:
            returncode = process.wait(timeout=limits.timeout_s)
            status = "exited" if returncode >= 0 else "killed"
        except subprocess.TimeoutExpired:
            kill(process)
            returncode, status = process.returncode, "timeout"
    return ChildRun(
        status=status,
        returncode=returncode,
        elapsed_s=time.monotonic() - started,
        stdout_tail=_tail(out_path),
        stderr_tail=_tail(err_path),
        network_isolated=isolated,
    )
