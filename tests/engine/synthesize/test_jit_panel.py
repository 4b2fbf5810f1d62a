"""A panel of wild-corpus modules whose original scripts with `torch.jit.script`: their rewritten
source still does. Each file is loaded on its own (its package's `__init__` is not run, so the
package's other dependencies need not be installed)."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch]

# (package folder, module, class, constructor arguments)
PANEL = [
    ("segment-anything-1.0", "segment_anything.modeling.transformer", "Attention", (64, 4)),
    ("fair-esm-2.0.0", "esm.modules", "RobertaLMHead", (64, 32, torch.zeros(32, 64))),  # calls the rewritten gelu
]


def _load(root: str, name: str, text: str | None = None):
    for key in [k for k in sys.modules if k.split(".")[0] == name.split(".")[0]]:
        del sys.modules[key]
    parts = name.split(".")
    for i in range(1, len(parts)):  # the packages as bare namespaces: their __init__ is not run
        package = types.ModuleType(".".join(parts[:i]))
        package.__path__ = [os.path.join(root, *parts[:i])]
        sys.modules[package.__name__] = package
    path = os.path.join(root, *parts) + ".py"
    with open(path, encoding="utf-8") as fh:
        source = fh.read()
    if text is not None:
        # torch.jit.script reads a class's source from its module's file: the rewritten text must be
        # that file (read from the original, its lines no longer match once a rewrite removes some)
        path = os.path.join(tempfile.mkdtemp(prefix="jit-panel-"), parts[-1] + ".py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(text if text is not None else source, path, "exec"), module.__dict__)  # noqa: S102
    return module, source


@pytest.mark.parametrize(("folder", "name", "cls", "args"), PANEL, ids=[p[1] + "." + p[2] for p in PANEL])
def test_rewritten_module_still_scripts(folder, name, cls, args):
    from benchmarks.wild_corpus import CACHE
    from engine.scan import scan_source, select_rules

    root = str(CACHE / folder)
    if not os.path.isdir(root):
        pytest.skip(f"the wild corpus is not unpacked in {CACHE} (run benchmarks/wild_corpus.py)")
    module, source = _load(root, name)
    torch.jit.script(getattr(module, cls)(*args))  # the original scripts
    _, rewritten = scan_source(source, select_rules("default"), module.__file__, name)
    assert rewritten != source, "the panel is of modules the engine rewrites"
    module, _ = _load(root, name, rewritten)
    torch.jit.script(getattr(module, cls)(*args))
