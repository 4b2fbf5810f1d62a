"""Run untrusted repository code in a child process that can reach nothing but its working copy.

Every model build (verification and benchmark, command line and worker) goes through here. With
bubblewrap (``bwrap``, Debian's ``bubblewrap``) the child runs:

- as another user: when the parent is root, bwrap sets the sandbox up with its privileges and the
  command drops to uid/gid 65534 (``setpriv``) before anything else runs, so outside the sandbox
  the child is ``nobody``; otherwise in a user namespace of its own as uid 65534;
- in new pid, mount, network, IPC, UTS (and cgroup) namespaces: a fresh ``/proc`` that shows only
  its own processes (no ``/proc/<ppid>/environ``), only a loopback interface, no ``/run`` and no
  Unix socket of the host (Postgres's ``/var/run/postgresql`` does not exist in there);
- with an allowlist of mounts: ``/usr`` and the other system folders, the Python installation and
  its environment read-only (torch imports from there), the working copy and the job's folders
  read-write, a private ``/tmp``; no home, no ``/etc`` beyond what the dynamic loader reads;
- with limits for the whole tree: the pid namespace and ``--die-with-parent`` kill every
  descendant (a ``setsid`` grandchild too) when the run ends, is stopped by its time limit, or its
  parent dies (a killed Celery pool process); ``prlimit`` inside caps address space per process,
  the number of processes of the sandbox's user, CPU seconds per process and file size;
- a scrubbed environment (``scrubbed_env``) and ``python -I``.

Fail closed: in production (``ADOPTER_ENV`` other than ``development``, the service's settings
switch) or with ``ADOPTER_SANDBOX=require``, no working sandbox means ``SandboxUnavailable``: the
caller reports that repository code was not run and why. In development the child runs with only
the old protections (scrubbed environment, rlimits, ``unshare -n`` where allowed) and a loud
warning says so; ``ADOPTER_SANDBOX=off`` asks for that explicitly (refused in production).
"""

from __future__ import annotations

import functools
import glob
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("adopter.sandbox")

# Variables a child may inherit (values copied from the parent when set). Everything else is dropped.
_PASSTHROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
SANDBOX_UID = SANDBOX_GID = 65534  # nobody/nogroup
# System folders mounted read-only (or recreated as the same symlink, /lib -> usr/lib on merged-/usr systems).
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What the dynamic loader and a few libraries read from /etc; nothing else of /etc is visible.
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")


class SandboxUnavailable(RuntimeError):
    """Repository code was not run: no working sandbox where one is required."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 300.0
    memory_bytes: int | None = 6 * 1024**3
    threads: int | None = None  # torch intra-op threads in the child; None: torch's default
    network: bool = False  # allow network (never needed for verification)
    processes: int = 512  # processes and threads of the sandbox's user (torch's thread pools count)
    file_bytes: int = 8 * 1024**3  # largest file the child may write

    def cpu_seconds(self) -> int:
        """CPU seconds per process: the wall limit on every core (the wall limit stops the tree first
        unless a process escaped it, which the pid namespace prevents)."""
        return int(self.timeout_s * max(1, os.cpu_count() or 1)) + 10


@dataclass
class ChildRun:
    """What happened to one child process."""

    status: str  # "exited", "timeout", "killed" (a signal, e.g. the kernel's OOM killer)
    returncode: int | None
    elapsed_s: float
    stdout_tail: str
    stderr_tail: str
    network_isolated: bool
    sandboxed: bool = False

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
        USER="sandbox",  # getpass.getuser() (torch's caches) reads these before the password file
        LOGNAME="sandbox",
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


# --------------------------------------------------------------------------------------------------
# Policy: production requires the sandbox


def production() -> bool:
    """The service's own switch (``ADOPTER_ENV``, read by ``app.settings``); the CLI is development."""
    return os.environ.get("ADOPTER_ENV", "development").strip().lower() != "development"


def sandbox_required() -> bool:
    return production() or os.environ.get("ADOPTER_SANDBOX", "").strip().lower() == "require"


def _sandbox_declined() -> bool:
    return not production() and os.environ.get("ADOPTER_SANDBOX", "").strip().lower() == "off"


# --------------------------------------------------------------------------------------------------
# bubblewrap command line


def _python_dirs() -> list[str]:
    """The Python installation and environment the child needs, read-only."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
            os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    for entry in sys.path:  # site folders outside the prefixes (a system dist-packages)
        if entry.endswith(("site-packages", "dist-packages")) and os.path.isdir(entry):
            dirs.add(entry)
    real = sorted({os.path.realpath(d) for d in dirs if d and os.path.isdir(d)} | {d for d in dirs if d and os.path.isdir(d)})
    out: list[str] = []
    for path in sorted(real, key=len):  # a folder inside one already mounted comes with it
        if not any(path == kept or path.startswith(kept.rstrip("/") + "/") for kept in out):
            out.append(path)
    return [p for p in out if p not in ("/", "/usr") and not p.startswith("/usr/")]


def _ancestors(path: str) -> list[str]:
    parts = Path(path).parts[1:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


class _Mounts:
    """bwrap mount arguments; parent folders are created 0755 (bwrap would copy a 0700 /root)."""

    def __init__(self) -> None:
        self.args: list[str] = []
        self._made: set[str] = {"/"}
        self._mounted: list[str] = []

    def _inside_mount(self, path: str) -> bool:
        return any(path == m or path.startswith(m.rstrip("/") + "/") for m in self._mounted)

    def _parents(self, dest: str) -> None:
        for parent in _ancestors(dest):
            if parent in self._made or self._inside_mount(parent):
                continue
            self.args += ["--perms", "0755", "--dir", parent]
            self._made.add(parent)

    def add(self, option: str, source: str, dest: str | None = None) -> None:
        dest = dest or source
        self._parents(dest)
        self.args += [option, source, dest]
        self._mounted.append(dest)
        self._made.add(dest)

    def special(self, option: str, dest: str) -> None:  # a fresh filesystem (tmpfs, proc, dev): folders can be made in it
        self._parents(dest)
        self.args += [option, dest]
        self._made.add(dest)


def _bwrap_command(command: list[str], *, cwd: Path, writable: list[Path], readable: list[Path],
                   limits: Limits, cuda: bool) -> list[str]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)")
    root = os.geteuid() == 0
    mounts = _Mounts()
    for path in _SYSTEM_DIRS:
        if os.path.islink(path):
            mounts.args += ["--symlink", os.readlink(path), path]
            mounts._made.add(path)
        elif os.path.isdir(path):
            mounts.add("--ro-bind", path)
    for path in _ETC_FILES:
        if os.path.exists(path):
            mounts.add("--ro-bind", path)
    mounts.special("--proc", "/proc")
    mounts.special("--dev", "/dev")
    if cuda:  # the GPU's device nodes and what its driver reads; nothing else of /sys
        for node in sorted(glob.glob("/dev/nvidia*")):
            mounts.add("--dev-bind", node)
        mounts.add("--ro-bind-try", "/sys", "/sys")
    mounts.args += ["--perms", "1777", "--size", str(1024**3)]  # a private /tmp anyone inside may use
    mounts.special("--tmpfs", "/tmp")
    # after the private /tmp: a Python environment that lives under /tmp (a CI checkout's venv) is
    # bound on top of it instead of being hidden by it
    for path in _python_dirs():
        mounts.add("--ro-bind", path)
    for path in readable:
        mounts.add("--ro-bind-try", str(path))
    for path in writable:
        mounts.add("--bind", str(path))
    argv = [bwrap, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--hostname", "adopter-sandbox", "--die-with-parent", "--new-session"]
    if not limits.network:
        argv.append("--unshare-net")
    if root:
        # bwrap sets up with root's privileges (it can read a Python under a 0700 /root); the
        # command then becomes nobody, which also makes the process limit count (root is exempt).
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--disable-userns"]
    argv += mounts.args + ["--chdir", str(cwd), "--"]
    if root:
        argv += ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_GID}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    rlimits = [f"--nproc={limits.processes}", f"--cpu={limits.cpu_seconds()}", f"--fsize={limits.file_bytes}",
               "--core=0"]
    if limits.memory_bytes and not cuda:  # CUDA reserves far more address space than it uses
        rlimits.append(f"--as={limits.memory_bytes}")
    return argv + ["prlimit", *rlimits, "--", *command]


_PROBE = r"""
import json, os, socket
print(json.dumps({"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                  "ifaces": [name for _, name in socket.if_nameindex()], "run": os.path.exists("/run"),
                  "home": os.path.exists(os.path.expanduser("~root"))}))
"""


@functools.cache
def _probe() -> tuple[bool, str]:
    """Start one sandbox with the real command line and check what it promises; (works, why not)."""
    try:
        argv = _bwrap_command([sys.executable, "-I", "-c", _PROBE], cwd=Path("/tmp"), writable=[], readable=[],
                              limits=Limits(timeout_s=30), cuda=False)
    except SandboxUnavailable as exc:
        return False, str(exc)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, env={"PATH": "/usr/bin:/bin"},
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap could not start: {exc}"
    if done.returncode != 0:
        return False, f"bwrap failed (exit {done.returncode}): {done.stderr.decode(errors='replace').strip()[-400:]}"
    try:
        seen = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, f"the sandbox probe printed no report: {done.stdout[-200:]!r}"
    problems = []
    if seen["uid"] != SANDBOX_UID:
        problems.append(f"runs as uid {seen['uid']}")
    if len(seen["pids"]) > 4:
        problems.append(f"sees {len(seen['pids'])} processes")
    if set(seen["ifaces"]) - {"lo"}:
        problems.append(f"has network interfaces {seen['ifaces']}")
    if seen["run"]:
        problems.append("sees /run")
    if problems:
        return False, "the sandbox is not isolated: " + ", ".join(problems)
    return True, "bubblewrap (" + ("root, drops to uid 65534" if os.geteuid() == 0 else "user namespace") + ")"


def sandbox_status() -> tuple[bool, str]:
    """Whether a working sandbox is available here, and how it works or why not."""
    if _sandbox_declined():
        return False, "ADOPTER_SANDBOX=off"
    return _probe()


# --------------------------------------------------------------------------------------------------
# Fallback without bubblewrap (development only)


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
    """Whether the child gets no network: the sandbox, or ``unshare -n`` in the unsandboxed fallback."""
    return sandbox_status()[0] or bool(_unshare_prefix())


def _limit_child(memory_bytes: int | None) -> None:  # runs in the unsandboxed child between fork and exec
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


@functools.cache
def _warn_unsandboxed(reason: str) -> None:
    message = (f"WARNING: Adopter runs repository code WITHOUT a sandbox ({reason}); it can read your files "
               "and environment. Install bubblewrap, or never verify code you do not trust.")
    log.warning(message)
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------


def _tail(path: Path, limit: int = 8000) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _shared_folders() -> set[str]:
    """Folders that other processes and users share: never writable to a child, never handed over."""
    try:
        here = os.getcwd()
    except OSError:  # the parent's folder was removed
        here = "/"
    shared = {"/", tempfile.gettempdir(), os.path.expanduser("~"), here, *_python_dirs(), *_SYSTEM_DIRS,
              "/etc", "/var", "/run", "/home", "/root", "/srv", "/opt", "/mnt", "/media", "/dev", "/proc", "/sys"}
    return {os.path.realpath(path) for path in shared}


def _check_private(paths: list[Path]) -> None:
    """Refuse a writable folder that is, or holds, a shared one (``/tmp``, a home, the Python
    environment): bound writable it would let repository code reach other processes' files, and
    handing it over (``_hand_over``) would give all of them to nobody."""
    shared = _shared_folders()
    for path in paths:
        real = os.path.realpath(path)
        for folder in shared:
            if real == folder or folder.startswith(real.rstrip("/") + "/"):
                raise SandboxUnavailable(
                    f"refusing to run repository code: {path} would be writable to it, and it "
                    + ("is" if real == folder else f"holds {folder}") + ", a folder other processes share; "
                    "give it a folder of its own (a new folder inside the temporary directory)")


def _hand_over(paths: list[Path]) -> None:
    """Make the child's folders its own when it runs as nobody (the parent is root). The caller has
    checked that they are private (``_check_private``)."""
    if os.geteuid() != 0:
        return
    for top in paths:
        if not top.exists():
            continue
        os.chown(top, SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)
        for directory, subdirs, files in os.walk(top):
            for name in subdirs + files:
                os.chown(os.path.join(directory, name), SANDBOX_UID, SANDBOX_GID, follow_symlinks=False)


def python_command(script: Path, *args: str, network: bool = False) -> tuple[list[str], bool]:
    """The unsandboxed command line running ``script`` isolated; and whether the network is cut off."""
    prefix = () if network else _unshare_prefix()
    return [*prefix, sys.executable, "-I", str(script), *args], bool(prefix)


class SandboxedPopen(subprocess.Popen):
    sandboxed: bool = False
    network_isolated: bool = False

    def normalized_returncode(self) -> int | None:
        """bwrap reports a child killed by signal N as exit 128+N; give it back as -N like Popen."""
        code = self.returncode
        if self.sandboxed and code is not None and 128 < code <= 128 + 64:
            return -(code - 128)
        return code


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
    writable: list[Path] | tuple[Path, ...] = (),
    readable: list[Path] | tuple[Path, ...] = (),
) -> tuple[SandboxedPopen, bool]:
    """Start ``script`` as a sandboxed child; the caller owns the process (see ``kill``).

    The child may write ``cwd``, ``home`` and ``writable`` and read ``readable`` besides the script,
    the Python environment and the system folders. Raises ``SandboxUnavailable`` where a sandbox is
    required and none works."""
    env = scrubbed_env(home, threads=limits.threads)
    works, why = sandbox_status()
    if works:
        rw = list(dict.fromkeys([Path(cwd), Path(home), *map(Path, writable)]))
        _check_private(rw)
        _hand_over(rw)
        command = _bwrap_command([sys.executable, "-I", str(script), *args], cwd=Path(cwd), writable=rw,
                                 readable=[Path(script), *map(Path, readable)], limits=limits, cuda=cuda)
        process = SandboxedPopen(command, cwd="/", env={**env, "TMPDIR": "/tmp"}, stdin=stdin, stdout=stdout,
                                 stderr=stderr, start_new_session=True, close_fds=True)
        process.sandboxed, process.network_isolated = True, not limits.network
        return process, process.network_isolated
    if sandbox_required():
        raise SandboxUnavailable(
            f"refusing to run repository code: no working sandbox ({why})"
            + ("; production (ADOPTER_ENV) requires one" if production() else "; ADOPTER_SANDBOX=require"))
    _warn_unsandboxed(why)
    command, isolated = python_command(script, *args, network=limits.network)
    memory = None if cuda else limits.memory_bytes
    process = SandboxedPopen(
        command,
        cwd=str(cwd),
        env=env,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # its own process group, so a timeout kills grandchildren too
        preexec_fn=functools.partial(_limit_child, memory),
        close_fds=True,
    )
    process.network_isolated = isolated
    return process, isolated


def kill(process: subprocess.Popen) -> None:
    """Kill the child and everything it started: its process group, and (sandboxed) bwrap, whose
    death takes the whole pid namespace with it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_child(
    script: Path, args: list[str], *, cwd: Path, home: Path, log_dir: Path, limits: Limits, cuda: bool = False,
    writable: list[Path] | tuple[Path, ...] = (), readable: list[Path] | tuple[Path, ...] = (),
) -> ChildRun:
    """Run ``script`` to completion (or until the time limit) and report how it ended. Whatever
    stops the caller meanwhile (an exception such as Celery's soft time limit) kills the child."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / "stdout.txt", log_dir / "stderr.txt"
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        process, isolated = popen(
            script, args, cwd=cwd, home=home, limits=limits, cuda=cuda,
            stdin=subprocess.DEVNULL, stdout=out, stderr=err, writable=[log_dir, *writable], readable=readable,
        )
        try:
            process.wait(timeout=limits.timeout_s)
            returncode = process.normalized_returncode()
            status = "exited" if returncode is not None and returncode >= 0 else "killed"
        except subprocess.TimeoutExpired:
            kill(process)
            returncode, status = process.returncode, "timeout"
        finally:
            if process.returncode is None:  # the caller was interrupted: nothing may outlive it
                kill(process)
    return ChildRun(
        status=status,
        returncode=returncode,
        elapsed_s=time.monotonic() - started,
        stdout_tail=_tail(out_path),
        stderr_tail=_tail(err_path),
        network_isolated=isolated,
        sandboxed=process.sandboxed,
    )
