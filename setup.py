"""Build hook: compile the extractor with mypyc when this machine can.

Everything else about the package is declared in pyproject.toml. Extraction runs over every class of
every file a scan reads, and the corpus benchmark (benchmarks/extract_speed.py) holds it to 2x the
time of `ast.parse` alone; interpreted, the extractor needs about 2.2x, compiled with mypyc about
1.8x. The compiled module is `engine/extract/extractor.py` itself, as a C extension, so the same
source is the reference for both.

Compilation is best effort: without mypyc or a C compiler, or with ADOPTER_PURE_PYTHON=1 set, the
package installs with the interpreted extractor and a warning. Next to each compiled module the
build writes `<module>.native.json` holding the SHA-256 of the source it was compiled from;
`engine/extract/_native.py` loads the source instead of a compiled module whose stamp does not match
(an edited checkout never runs stale compiled code).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

COMPILED = ["engine/extract/extractor.py"]
HERE = Path(__file__).resolve().parent


def _warn(message: str) -> None:
    print(f"adopter build: {message}; the extractor stays interpreted (slower, same results)", file=sys.stderr)


class _BestEffortBuildExt(build_ext):
    """build_ext that never fails the install: a compile error leaves the pure-Python module in place.
    After a successful build it writes the source stamp beside each compiled module."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers, ...
            _warn(f"compiling failed ({exc})")
            self._remove_outputs()
            return
        if not self.extensions:
            return  # nothing was compiled: a stamp now would vouch for a stale module beside the source
        for source in COMPILED:
            fullname = source.removesuffix(".py").replace("/", ".")
            target = Path(self.get_ext_fullpath(fullname)).parent / (Path(source).stem + ".native.json")
            digest = hashlib.sha256((HERE / source).read_bytes()).hexdigest()
            target.write_text(json.dumps({"source": Path(source).name, "sha256": digest}) + "\n")

    def _remove_outputs(self) -> None:
        # a half-built set (the runtime library without the module, or the reverse) must not load
        for ext in self.extensions:
            path = Path(self.get_ext_fullpath(ext.name))
            if path.exists():
                path.unlink()


def _ext_modules() -> list:
    if os.environ.get("ADOPTER_PURE_PYTHON"):
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not available")
        return []
    try:
        return mypycify(COMPILED, opt_level="3", verbose=False)
    except BaseException as exc:  # a type error in the source stops mypyc with SystemExit
        _warn(f"mypyc could not translate the extractor ({exc!r})")
        return []


setup(ext_modules=_ext_modules(), cmdclass={"build_ext": _BestEffortBuildExt})
