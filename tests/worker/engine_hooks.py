"""The scan stage as the end-to-end tests run it (``ADOPTER_ENGINE_SCAN=tests.worker.engine_hooks:scan_path``).

The real engine (``engine.scan.scan_path``) with one test-only addition: a pause. While
``$ADOPTER_TEST_PAUSE_DIR/arm`` exists, a scan writes ``started`` there and waits for ``release``
(or two minutes), so a test can kill the worker in the middle of a scan.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


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
