"""Engine stages as the end-to-end tests run them (``ADOPTER_ENGINE_SCAN`` and ``ADOPTER_ENGINE_VERIFY``).

The real engine with two test-only additions:

- ``scan_path`` pauses: while ``$ADOPTER_TEST_PAUSE_DIR/arm`` exists, a scan writes ``started``
  there and waits for ``release`` (or two minutes), so a test can kill the worker mid-scan.
- ``verify`` first records, in ``$ADOPTER_TEST_PAUSE_DIR/runner-<pid>.json``, what the process
  that builds repository code can read of itself and of its parent (the Celery main process):
  environment variable names, ``/proc/self/environ``, ``/proc/<ppid>/environ`` and command lines.
  That is what the red team's harness read the App key from. While
  ``$ADOPTER_TEST_PAUSE_DIR/kill-verify`` exists, it then notes its pid in ``killed.log`` and kills
  its own process (SIGKILL), as hostile repository code can.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def _read(path: str) -> str:
    try:
        return Path(path).read_bytes().replace(b"\0", b"\n").decode(errors="replace")
    except OSError as exc:
        return f"<unreadable: {exc}>"


def _record_runner_view() -> None:
    pause = os.environ.get("ADOPTER_TEST_PAUSE_DIR")
    if not pause:
        return
    ppid = os.getppid()
    view = {
        "pid": os.getpid(), "ppid": ppid, "environ_keys": sorted(os.environ),
        "self_environ": _read("/proc/self/environ"), "parent_environ": _read(f"/proc/{ppid}/environ"),
        "self_cmdline": _read("/proc/self/cmdline"), "parent_cmdline": _read(f"/proc/{ppid}/cmdline"),
    }
    (Path(pause) / f"runner-{os.getpid()}.json").write_text(json.dumps(view))


def verify(root: Path, files: dict[str, str]):
    from engine.verify import verify as engine_verify

    _record_runner_view()
    pause = os.environ.get("ADOPTER_TEST_PAUSE_DIR")
    if pause and (Path(pause) / "kill-verify").exists():
        with open(Path(pause) / "killed.log", "a") as log:
            log.write(f"{os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    return engine_verify(root, files)


def _maybe_pause() -> None:
    pause = os.environ.get("ADOPTER_TEST_PAUSE_DIR")
    if not pause or not (Path(pause) / "arm").exists():
        return
    (Path(pause) / "started").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not (Path(pause) / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def scan_path(root: Path, *, rules: str = "default", include=None, exclude=None):
    from engine.scan import scan_path as engine_scan_path

    _maybe_pause()
    return engine_scan_path(root, rules=rules, include=include, exclude=exclude)
