"""The mypyc-compiled extractor (setup.py) and the source it is built from.

* where compiling is required (CI sets ADOPTER_REQUIRE_COMPILED=1) the compiled module is the one
  loaded;
* compiled and interpreted extraction give equal structures over the whole corpus and the test
  sources (slow);
* a compiled module that is not current (no stamp, another source's stamp) or that is turned off
  with ADOPTER_PURE_PYTHON is never imported: checked with a stand-in extension file that would
  fail to import, so these run whether or not this checkout was compiled.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import engine.extract
from engine.extract import _native

ROOT = Path(__file__).resolve().parents[3]
COMPILED = engine.extract.IMPLEMENTATION == "compiled"


def test_compiled_module_is_loaded_where_required():
    if not os.environ.get("ADOPTER_REQUIRE_COMPILED"):
        pytest.skip("ADOPTER_REQUIRE_COMPILED is not set (CI sets it)")
    assert engine.extract.IMPLEMENTATION == "compiled"
    module = sys.modules["engine.extract.extractor"]
    assert not module.__file__.endswith(".py")


@pytest.mark.slow
def test_compiled_and_interpreted_extraction_agree_on_the_corpus():
    if not COMPILED:
        pytest.skip(f"the extractor is {engine.extract.IMPLEMENTATION}: nothing to compare")
    from benchmarks.corpus import all_files
    from engine.extract.extractor import extract_source as compiled_extract
    from engine.extract.imports import module_name_for

    interpreted = _native.load_source("adopter_interpreted_extractor", ROOT / "engine/extract/extractor.py")
    try:
        assert interpreted.__file__.endswith(".py")
        texts = [(p.read_text(), str(p), module_name_for(p)) for p in all_files()]
        # sources of the extraction tests: unusual shapes the corpus may not have
        texts += [(p.read_text(), str(p), "tests") for p in sorted((ROOT / "tests/engine").rglob("*.py"))]
        differing = []
        for text, path, module in texts:
            a = compiled_extract(text, path, module)
            b = interpreted.extract_source(text, path, module)
            if a != b:
                differing.append(path)
        assert len(texts) > 200
        assert not differing, differing[:10]
    finally:
        sys.modules.pop("adopter_interpreted_extractor", None)


def _copy_package(tmp_path: Path) -> Path:
    """engine/ copied without compiled files; a stand-in 'compiled extractor' that raises on import."""
    dest = tmp_path / "src"
    shutil.copytree(ROOT / "engine", dest / "engine",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd", "*.native.json"))
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    # not a loadable extension: importing it fails loudly, which is what these tests look for
    (dest / "engine/extract" / f"extractor{suffix}").write_bytes(b"not an extension module")
    return dest


def _implementation(src: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "ADOPTER_PURE_PYTHON"}
    environment.update(env, PYTHONPATH=str(src))
    code = ("import engine.extract as e, sys; m = sys.modules['engine.extract.extractor']; "
            "print(e.IMPLEMENTATION); print(m.__file__); "
            "print(len(e.extract_source('import torch\\nclass M(torch.nn.Module):\\n    def forward(self, x):\\n"
            "        return x.relu()\\n', 'm.py', 'm').classes))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment,
                          cwd=src, timeout=60)


def _stamp(src: Path, sha256: str) -> None:
    (src / "engine/extract/extractor.native.json").write_text(json.dumps({"source": "extractor.py", "sha256": sha256}))


def test_compiled_module_without_a_stamp_is_not_loaded(tmp_path):
    src = _copy_package(tmp_path)
    run = _implementation(src)
    assert run.returncode == 0, run.stderr
    implementation, loaded, classes = run.stdout.split("\n")[:3]
    assert implementation == "interpreted (no readable build stamp extractor.native.json)"
    assert loaded == str(src / "engine/extract/extractor.py")
    assert classes == "1"


def test_compiled_module_of_another_source_is_not_loaded(tmp_path):
    src = _copy_package(tmp_path)
    _stamp(src, hashlib.sha256(b"an older extractor.py").hexdigest())
    run = _implementation(src)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("interpreted (extractor.py changed since it was compiled")
    assert run.stdout.split("\n")[1].endswith("extractor.py")


def test_pure_python_switch_wins_over_a_current_compiled_module(tmp_path):
    src = _copy_package(tmp_path)
    _stamp(src, hashlib.sha256((src / "engine/extract/extractor.py").read_bytes()).hexdigest())
    run = _implementation(src, ADOPTER_PURE_PYTHON="1")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("interpreted (ADOPTER_PURE_PYTHON is set)")
    # and without the switch, the (stand-in) compiled module is what gets imported: the check is real
    run = _implementation(src)
    assert run.returncode != 0
    assert "extractor" in run.stderr and "ImportError" in run.stderr


def test_version_says_which_extractor_runs():
    run = subprocess.run([sys.executable, "-m", "engine.cli", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("adopter ")
    assert f"extractor {engine.extract.IMPLEMENTATION})" in run.stdout
    forced = subprocess.run([sys.executable, "-m", "engine.cli", "--version"], capture_output=True, text=True,
                            cwd=ROOT, timeout=60, env={**os.environ, "ADOPTER_PURE_PYTHON": "1"})
    assert "extractor interpreted" in forced.stdout
