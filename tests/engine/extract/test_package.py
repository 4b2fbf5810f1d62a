"""Base classes from another file of the scanned repository (engine/extract/package.py): the base's
`__init__` gives its layers to a subclass of another file, found by static import resolution over
the repository's own files; anything it cannot follow gives nothing."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from engine.extract.package import PackageIndex
from engine.scan import scan_path, scan_source, select_rules

BASE = '''\
import torch.nn as nn


class BaseAttention(nn.Module):
    def __init__(self, dim, heads, drop=0.0):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.softmax = nn.Softmax(dim=-1)
        self.attn_drop = nn.Dropout(drop)
        self.proj = nn.Linear(dim, dim)
'''

SUB = '''\
import torch
{import_line}


class WindowAttention({base}):
    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn = self.softmax(attn)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(b, n, c)
        return self.proj(x)
'''


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def _applied(root: Path, rel: str) -> list:
    result = scan_path(root, rules="sdpa-attention")
    return [f for f in result.findings if f.file == rel and f.status in ("rewritten", "guarded")]


def _sub(import_line: str, base: str = "BaseAttention") -> str:
    return SUB.format(import_line=import_line, base=base)


def test_subclass_fires_thanks_to_the_base_init_of_another_file(tmp_path):
    root = _package(tmp_path, {"pkg/__init__.py": "", "pkg/layers/__init__.py": "", "pkg/layers/base.py": BASE,
                               "pkg/models/__init__.py": "",
                               "pkg/models/window.py": _sub("from ..layers.base import BaseAttention")})
    found = _applied(root, "pkg/models/window.py")
    assert [f.cls for f in found] == ["WindowAttention"]
    result = scan_path(root, rules="sdpa-attention")
    assert "scaled_dot_product_attention" in result.files["pkg/models/window.py"]
    assert "pkg/layers/base.py" not in result.files  # the base itself has no attention to rewrite
    # verification rewrites each rule's files again on their own, with the same repository
    from engine.pipeline import rewrite_groups

    groups, notes = rewrite_groups(result, root)
    assert [g.file for g in groups] == ["pkg/models/window.py"] and not notes
    assert groups[0].text == result.files["pkg/models/window.py"]
    # the same file scanned alone knows nothing of `self.softmax`: no rewrite
    alone, _ = scan_source((root / "pkg/models/window.py").read_text(), select_rules("sdpa-attention"),
                           "pkg/models/window.py", "pkg.models.window")
    assert not [f for f in alone if f.status in ("rewritten", "guarded")]


def test_re_export_absolute_import_and_module_alias(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/utils/__init__.py": "from .attention import BaseAttention\n",
             "pkg/utils/attention.py": BASE}
    for i, (line, base) in enumerate([("from ..utils import BaseAttention", "BaseAttention"),
                                      ("from pkg.utils import BaseAttention as Base", "Base"),
                                      ("import pkg.utils.attention as attention", "attention.BaseAttention"),
                                      ("from pkg.utils import attention", "attention.BaseAttention")]):
        files[f"pkg/models/m{i}.py"] = _sub(line, base)
    files["pkg/models/__init__.py"] = ""
    root = _package(tmp_path, files)
    result = scan_path(root, rules="sdpa-attention")
    fired = sorted(f.file for f in result.findings if f.status in ("rewritten", "guarded"))
    assert fired == [f"pkg/models/m{i}.py" for i in range(4)]


def test_base_from_outside_the_repository_is_a_near_miss(tmp_path):
    # `otherlib` is not a file of the repository: its `__init__` is never read, nothing is known
    root = _package(tmp_path, {"pkg/__init__.py": "", "pkg/window.py": _sub("from otherlib import BaseAttention")})
    assert not _applied(root, "pkg/window.py")


def test_what_cannot_be_followed_gives_nothing(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        # a star import may bind any name: the re-export is not followed
        "pkg/star/__init__.py": "from .attention import *\n", "pkg/star/attention.py": BASE,
        # bound twice: which one holds depends on the run
        "pkg/twice/__init__.py": "try:\n    from fast import BaseAttention\nexcept ImportError:\n"
                                 "    from .attention import BaseAttention\n",
        "pkg/twice/attention.py": BASE,
        "pkg/a.py": _sub("from .star import BaseAttention"),
        "pkg/b.py": _sub("from .twice import BaseAttention"),
        # a relative import reaching above the repository
        "c.py": _sub("from ..pkg.star.attention import BaseAttention"),
    })
    result = scan_path(root, rules="sdpa-attention")
    assert not [f for f in result.findings if f.status in ("rewritten", "guarded")]


def test_resolution_reads_only_the_files_it_needs_once(tmp_path):
    root = _package(tmp_path, {"pkg/__init__.py": "", "pkg/base.py": BASE, "pkg/unrelated.py": "x = (\n",
                               "pkg/one.py": _sub("from .base import BaseAttention"),
                               "pkg/two.py": _sub("from pkg.base import BaseAttention")})
    index = PackageIndex(root, ["pkg/__init__.py", "pkg/base.py", "pkg/unrelated.py", "pkg/one.py", "pkg/two.py"])
    for rel in ("pkg/one.py", "pkg/two.py"):
        tree = ast.parse((root / rel).read_text())
        base = next(n for n in tree.body if isinstance(n, ast.ClassDef)).bases[0]
        assert index.resolve(rel, tree, base) == ("pkg/base.py", "BaseAttention")
        layers = index.base_layers(rel, tree, base)
        assert {layer.attr for layer in layers} >= {"self.softmax", "self.attn_drop", "self.qkv"}
    assert set(index._parsed) == {"pkg/base.py"}  # never the unrelated (unparsable) file


def test_a_cycle_of_bases_ends(tmp_path):
    root = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "import torch.nn as nn\nfrom .b import B\n\nclass A(B):\n    def __init__(self):\n"
                    "        self.softmax = nn.Softmax(dim=-1)\n",
        "pkg/b.py": "import torch.nn as nn\nfrom .a import A\n\nclass B(A):\n    def __init__(self):\n"
                    "        self.drop = nn.Dropout(0.1)\n",
        "pkg/c.py": _sub("from .a import A", "A"),
    })
    scan_path(root, rules="sdpa-attention")  # terminates
    index = PackageIndex(root, ["pkg/__init__.py", "pkg/a.py", "pkg/b.py"])
    layers = index.class_layers("pkg/a.py", "A")
    assert layers is not None and {layer.attr for layer in layers} == {"self.softmax", "self.drop"}
