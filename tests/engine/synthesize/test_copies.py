"""`# Copied from` blocks are rewritten together with their source or not at all
(engine/synthesize/copies.py): a repository's copy check (`make fix-copies`) would undo a rewrite
of the copy alone and fail on a rewrite of the source alone."""

from __future__ import annotations

from pathlib import Path

from engine.scan import scan_path
from engine.synthesize import copies

SOURCE = '''import torch
from torch import nn


class BartAttention(nn.Module):
    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2)) * 0.125
        w = w.softmax(dim=-1)
        return torch.matmul(w, v)
'''

COPY = '''import torch
from torch import nn


# Copied from pkg.bart.BartAttention with Bart->Whisper
class WhisperAttention(nn.Module):
    def forward(self, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2)) * 0.125
        w = w.softmax(dim=-1)
        return torch.matmul(w, v)
'''

# the copy has drifted from its source: it also returns the weights, so it cannot be rewritten
DRIFTED = COPY.replace("        return torch.matmul(w, v)\n", "        return torch.matmul(w, v), w\n")


def _repo(tmp_path: Path, copy: str, with_source: bool = True) -> Path:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    if with_source:
        (pkg / "bart.py").write_text(SOURCE)
    (pkg / "whisper.py").write_text(copy)
    return tmp_path


def _status(result, file: str) -> list[tuple[str, str | None]]:
    return [(f.status, f.reason) for f in result.findings if f.file.endswith(file) and f.rule_id == "sdpa-attention"]


def test_a_copy_and_its_source_are_rewritten_together(tmp_path):
    result = scan_path(_repo(tmp_path, COPY), rules="sdpa-attention")
    assert sorted(result.files) == ["pkg/bart.py", "pkg/whisper.py"]
    assert _status(result, "whisper.py") == [("rewritten", None)]
    source = copies.block_text(result.files["pkg/bart.py"], "BartAttention")
    copy = copies.block_text(result.files["pkg/whisper.py"], "WhisperAttention")
    assert copy == source.replace("Bart", "Whisper")


def test_a_copy_whose_source_was_not_scanned_is_not_rewritten(tmp_path):
    result = scan_path(_repo(tmp_path, COPY, with_source=False), rules="sdpa-attention")
    assert result.files == {}
    [(status, reason)] = _status(result, "whisper.py")
    assert status == "near-miss" and "Copied from pkg.bart.BartAttention" in reason and "did not read" in reason


def test_a_source_whose_copy_cannot_follow_is_not_rewritten_either(tmp_path):
    result = scan_path(_repo(tmp_path, DRIFTED), rules="sdpa-attention")
    # the copy's weights escape (a near-miss of its own), and its source's rewrite would leave them
    # out of step, so that is withdrawn too
    assert result.files == {}
    [(status, reason)] = _status(result, "bart.py")
    assert status == "near-miss" and "would no longer agree" in reason


def test_marks_are_read_with_their_replacements():
    text = "# Copied from a.b.C.forward with C->D, all-casing\nclass X:\n    pass\n"
    [block] = copies.marked_blocks(text, "x.py")
    assert (block.name, block.source, block.replacements, block.all_casing) == ("X", "a.b.C.forward", (("C", "D"),), True)
    assert copies.resolve("a.b.C.forward", {"a.b": "a/b.py"}) == ("a/b.py", "C.forward")
    assert copies.resolve("z.C", {"a.b": "a/b.py"}) is None


def test_a_copy_spells_the_kernel_as_its_source_does(tmp_path):
    # the copy's file also imports `torch.nn.functional as F`, the source's does not: written alone
    # the copy would say `F.scaled_dot_product_attention` and the source `nn.functional....`
    with_f = COPY.replace("from torch import nn\n", "from torch import nn\nimport torch.nn.functional as F\n", 1)
    result = scan_path(_repo(tmp_path, with_f), rules="sdpa-attention")
    assert sorted(result.files) == ["pkg/bart.py", "pkg/whisper.py"]
    assert "nn.functional.scaled_dot_product_attention" in result.files["pkg/bart.py"]
    assert "nn.functional.scaled_dot_product_attention" in result.files["pkg/whisper.py"]
    assert "F.scaled_dot_product_attention" not in result.files["pkg/whisper.py"]


def test_a_copy_follows_its_source_as_fix_copies_would():
    source = "class A:\n    def f(self, x):\n        # a comment about A\n        return x + 1\n"
    copy_file = "import torch\n\n\n# Copied from m.A with A->LongerName\nclass LongerName:\n    def f(self, x):\n" \
                "        # a comment about LongerName\n        return x\n"
    [block] = copies.marked_blocks(copy_file, "c.py")
    new = copies.propagated(copy_file, block, copies.raw_block(source, "A"))
    assert new == "import torch\n\n\n# Copied from m.A with A->LongerName\nclass LongerName:\n    def f(self, x):\n" \
                  "        # a comment about LongerName\n        return x + 1\n"
    # code that reads a name the copy's file does not bind is not copied over
    assert copies.propagated(copy_file, block, copies.raw_block(source.replace("x + 1", "F.relu(x)"), "A")) is None
