"""The paper's corpus: PyTorch modeling files of transformers 4.34.1 (plus owlv2 from 4.35.0).

The wheels are fetched once with pip (no dependencies, nothing installed) into a cache folder and
the modeling files are unpacked beside them, keeping the package layout so that relative imports
(`from ...activations import ACT2FN`) resolve. Set ADOPTER_CORPUS_DIR to move the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ADOPTER_CORPUS_DIR", ROOT / ".cache" / "corpus"))
MODELING = re.compile(r"transformers/models/([^/]+)/modeling_(?!tf_|flax_)[^/]+\.py$")
GROUNDTRUTH = ROOT.parent / "shared" / "benchmarks" / "adopter-paper" / "groundtruth.tsv"


@contextlib.contextmanager
def cache_lock(cache: Path) -> Iterator[None]:
    """Hold the cache folder's lock: processes sharing a cache (the test workers of one run, two
    runs side by side) download and unpack one at a time, and none reads a half-unpacked folder."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wheel(version: str) -> Path:
    wheel_dir = CACHE / "wheels"
    found = sorted(wheel_dir.glob(f"transformers-{version}-*.whl"))
    if found:
        return found[0]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheel_dir),
         f"transformers=={version}"],
        check=True,
    )
    found = sorted(wheel_dir.glob(f"transformers-{version}-*.whl"))
    if not found:
        raise RuntimeError(f"pip did not produce a transformers {version} wheel in {wheel_dir}")
    return found[0]


def unpack(version: str) -> Path:
    """Unpack the modeling files (and the package's __init__ chain) of one release; return the
    folder holding the `transformers` package."""
    dest = CACHE / f"transformers-{version}"
    marker = dest / ".complete"
    if marker.exists():
        return dest
    with cache_lock(CACHE):
        if not marker.exists():  # another process may have unpacked it while this one waited
            _unpack(version, dest)
    return dest


def _unpack(version: str, dest: Path) -> None:
    marker = dest / ".complete"
    with zipfile.ZipFile(_wheel(version)) as wheel:
        for name in wheel.namelist():
            if MODELING.search(name) or name.endswith("__init__.py") and name.startswith("transformers/"):
                wheel.extract(name, dest)
            elif name in ("transformers/activations.py", "transformers/modeling_utils.py",
                          "transformers/pytorch_utils.py"):
                wheel.extract(name, dest)
    marker.write_text("ok\n")


def paper_corpus() -> dict[str, list[Path]]:
    """model name -> its PyTorch modeling files, for every model of transformers 4.34.1 and owlv2
    from 4.35.0 (the paper's corpus)."""
    files: dict[str, list[Path]] = {}
    for version, only in (("4.34.1", None), ("4.35.0", {"owlv2"})):
        base = unpack(version)
        for path in sorted((base / "transformers" / "models").glob("*/modeling_*.py")):
            match = MODELING.search(path.as_posix())
            if not match:
                continue
            model = match.group(1)
            if only is not None and model not in only:
                continue
            files.setdefault(model, []).append(path)
    return files


def paper_file(model: str) -> Path:
    """The one file of the benchmark row `model`: modeling_<model>.py."""
    for path in paper_corpus()[model]:
        if path.name == f"modeling_{model}.py":
            return path
    raise KeyError(model)


def all_files() -> list[Path]:
    return [p for paths in paper_corpus().values() for p in paths]
