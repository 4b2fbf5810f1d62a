"""Which extractor runs: the mypyc-compiled module (see setup.py) when it was built from the source
on disk, else the source itself.

A compiled module sits beside `extractor.py` as a C extension, which Python's import system prefers
to the `.py`. Its stamp (`extractor.native.json`, written by the build) holds the SHA-256 of the
source it was compiled from; when that differs from the source on disk (an edited checkout that was
not rebuilt) or no stamp is found, the source is loaded instead, under the same module name, so that
a stale compiled module never runs. ADOPTER_PURE_PYTHON=1 forces the source.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

MODULE = "engine.extract.extractor"
_HERE = Path(__file__).resolve().parent


def _compiled_files(stem: str) -> list[Path]:
    return [p for suffix in importlib.machinery.EXTENSION_SUFFIXES if (p := _HERE / f"{stem}{suffix}").exists()]


def _stamp_matches(stem: str) -> tuple[bool, str]:
    stamp = _HERE / f"{stem}.native.json"
    try:
        recorded = json.loads(stamp.read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False, f"no readable build stamp {stamp.name}"
    current = hashlib.sha256((_HERE / f"{stem}.py").read_bytes()).hexdigest()
    if recorded != current:
        return False, f"{stem}.py changed since it was compiled (rebuild: pip install -e .)"
    return True, ""


def choose() -> str:
    """Make `engine.extract.extractor` the right module (before anything imports it) and say which
    one it is: 'compiled' or 'interpreted (<why>)'."""
    if MODULE in sys.modules:
        return describe(sys.modules[MODULE])
    stem = MODULE.rpartition(".")[2]
    if not _compiled_files(stem):
        return "interpreted (not compiled: see setup.py)"
    if os.environ.get("ADOPTER_PURE_PYTHON"):
        why = "ADOPTER_PURE_PYTHON is set"
    else:
        ok, why = _stamp_matches(stem)
        if ok:
            return "compiled"
    load_source(MODULE, _HERE / f"{stem}.py")
    return f"interpreted ({why})"


def load_source(name: str, path: Path):
    """Import the `.py` file at `path` as module `name`, whatever compiled module sits beside it."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def describe(module) -> str:
    return "interpreted" if str(getattr(module, "__file__", "")).endswith(".py") else "compiled"
