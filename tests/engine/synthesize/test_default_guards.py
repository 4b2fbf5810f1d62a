"""A guarded rewrite whose guard holds in the model's default configuration would add a kernel
branch that never runs (VITS keeps its original attention when `self.window_size is not None`, and
`window_size` is 4 by default): it is reported with the defaults it read, and not rewritten."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.extract.package import PackageIndex
from engine.scan import scan_path, scan_source, select_rules
from engine.synthesize import defaults

CONFIG = '''
class ToyConfig:
    def __init__(self, hidden_size=16, window_size=4, use_bias=False):
        self.hidden_size = hidden_size
        self.window_size = window_size
        self.use_bias = use_bias
'''

MODELING = '''
import torch
from torch import nn

from .configuration_toy import ToyConfig


class ToyAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.window_size = config.window_size
        self.scale = 0.125

    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        p = w.softmax(dim=-1)
        out = torch.matmul(p, v)
        if self.window_size is not None:
            out = out + p.mean()
        return out
'''


def _package(tmp_path: Path, name: str, files: dict[str, str]) -> Path:
    """A repository holding the package `name` with `files` (file name -> source)."""
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for file, text in files.items():
        (pkg / file).write_text(text)
    return tmp_path


def _repo(tmp_path: Path, config: str) -> Path:
    return _package(tmp_path, "toy", {"configuration_toy.py": config, "modeling_toy.py": MODELING})


def test_a_guard_that_holds_by_default_is_reported_not_rewritten(tmp_path):
    result = scan_path(_repo(tmp_path, CONFIG), rules="sdpa-attention")
    [finding] = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "near-miss"
    assert "self.window_size is not None" in finding.reason and "window_size=4" in finding.reason
    assert "never run" in finding.reason
    assert result.files == {}


def test_a_guard_that_fails_by_default_keeps_the_guarded_rewrite(tmp_path):
    result = scan_path(_repo(tmp_path, CONFIG.replace("window_size=4", "window_size=None")), rules="sdpa-attention")
    [finding] = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "guarded", finding.reason
    assert "toy/modeling_toy.py" in result.files


def test_defaults_are_read_from_init_and_unknown_terms_decide_nothing():
    text = MODELING.replace("self.scale = 0.125", "self.scale = 0.125\n        self.flag = True")
    known = defaults.settings(Path("modeling_toy.py"), text, "ToyAttention")
    assert known == {"scale": 0.125, "flag": True}  # no configuration file beside it: window_size unknown
    assert defaults.holds_by_default("output_attentions or self.flag", known)
    assert not defaults.holds_by_default("output_attentions or not self.flag", known)
    assert not defaults.holds_by_default("output_attentions or self.window_size is not None", known)
    assert defaults.holds_by_default("self.scale == 0.125", known)


def test_one_text_gets_the_same_decision_as_the_folder_scan(tmp_path):
    """A rule's own rewrite of a file (the pull request's group, engine/pipeline.py) and the wild
    benchmark scan one text with `scan_source`: a kernel that would never run by default is
    reported there too, reading the configuration through the repository's index."""
    root = _repo(tmp_path, CONFIG)
    files = ["toy/__init__.py", "toy/configuration_toy.py", "toy/modeling_toy.py"]
    index = PackageIndex(root, files)
    findings, text = scan_source(MODELING, select_rules("sdpa-attention"), "toy/modeling_toy.py", "toy.modeling_toy",
                                 index)
    [finding] = [f for f in findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "near-miss" and "window_size=4" in finding.reason
    assert text == MODELING
    # without the repository the configuration is unknown: the guarded rewrite stands
    findings, text = scan_source(MODELING, select_rules("sdpa-attention"), "toy/modeling_toy.py", "toy.modeling_toy")
    assert [f.status for f in findings if f.rule_id == "sdpa-attention"] == ["guarded"]
    assert "scaled_dot_product_attention" in text


def test_a_configuration_outside_the_repository_is_not_read(tmp_path):
    """A hostile repository's `configuration_toy.py` that links outside it: the scan reads no file
    there (the defaults stay unknown, so the guard decides nothing)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "configuration_toy.py").write_text(CONFIG)
    repo = tmp_path / "repo"
    repo.mkdir()
    root = _repo(repo, CONFIG)
    link = root / "toy" / "configuration_toy.py"
    link.unlink()
    link.symlink_to(outside / "configuration_toy.py")
    result = scan_path(root, rules="sdpa-attention")
    [finding] = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "guarded", finding.reason


LAYERS = '''
import torch
from torch import nn


class KeepAttention(nn.Module):
    def __init__(self, dim, keep_attn=True):
        super().__init__()
        self.keep_attn = keep_attn
        self.scale = dim ** -0.5

    def forward(self, q, k, v):
        p = (torch.matmul(q, k.transpose(-1, -2)) * self.scale).softmax(dim=-1)
        if self.keep_attn:
            self.attn_weights = p
        return torch.matmul(p, v)


class Block(nn.Module):
    def __init__(self, dim, keep_attn=True):
        super().__init__()
        self.attn = KeepAttention(dim, keep_attn=keep_attn)
'''


def _two_files(tmp_path: Path, model: str) -> Path:
    return _package(tmp_path, "tab", {"layers.py": LAYERS, "model.py": model})


@pytest.mark.parametrize("model", [
    "from .layers import Block\n\n\ndef build(dim):\n    return Block(dim, False)\n",  # through Block's parameter
    "from . import layers\n\n\ndef build(dim):\n    return layers.KeepAttention(dim, keep_attn=False)\n",
    "from .layers import Block\n\n\ndef build(dim, **options):\n    return Block(dim, **options)\n",  # may pass it
    "from .layers import Block\n\n\ndef build(dim, keep):\n    return Block(dim, keep_attn=keep)\n",  # unknown
    # through a module of the repository the scan did not read (a re-export)
    "from .common import Block\n\n\ndef build(dim):\n    return Block(dim, keep_attn=False)\n",
])
def test_a_construction_in_another_file_that_fails_the_guard_keeps_the_guarded_rewrite(tmp_path, model):
    """`keep_attn` is True by default, but a construction the repository holds passes False (or a
    value that may be False): the kernel runs there, so the guarded rewrite is kept."""
    result = scan_path(_two_files(tmp_path, model), rules="sdpa-attention")
    [finding] = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "guarded", finding.reason
    assert "scaled_dot_product_attention" in result.files["tab/layers.py"]


@pytest.mark.parametrize("model", [
    "from .layers import Block\n\n\ndef build(dim):\n    return Block(dim)\n",
    "from .layers import Block, KeepAttention\n\n\ndef build(dim):\n    return Block(dim, keep_attn=True), KeepAttention(dim, True)\n",
    # a class of the same name elsewhere is another class
    "from other.layers import Block\n\n\ndef build(dim):\n    return Block(dim, keep_attn=False)\n",  # not ours
    "import torch\n\n\nclass KeepAttention(torch.nn.Module):\n    pass\n\n\ndef build(dim):\n    return KeepAttention(dim, keep_attn=False)\n",
])
def test_constructions_that_keep_the_default_report_the_kernel_never_runs(tmp_path, model):
    result = scan_path(_two_files(tmp_path, model), rules="sdpa-attention")
    [finding] = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "near-miss" and "keep_attn=True" in finding.reason and "never run" in finding.reason
    assert "tab/layers.py" not in result.files


def test_a_forwarded_parameter_rebound_in_the_constructor_is_unknown(tmp_path):
    layers = LAYERS.replace("        self.attn = KeepAttention", "        keep_attn = not keep_attn\n        self.attn = KeepAttention")
    root = _two_files(tmp_path, "")
    (root / "tab" / "layers.py").write_text(layers)
    result = scan_path(root, rules="sdpa-attention")
    [finding] = [f for f in result.findings if f.rule_id == "sdpa-attention"]
    assert finding.status == "guarded", finding.reason
