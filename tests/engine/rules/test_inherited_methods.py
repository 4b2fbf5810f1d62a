"""Methods inherited from a base class of another file of the repository (labml's ALiBi attention calls
`self.get_scores`, which `MultiHeadAttention` of `transformers/mha.py` defines with the
`nn.Softmax(dim=1)` it builds): the method is inlined as one of the class's own, read in its own
file, only along single inheritance (where the method resolution order is the chain of bases). With
it, two facts the scores' layout needs: `scores += bias` writes into the scores (their shape stays,
whatever the bias's rank), and an `x.shape[k]` read wherever the method runs (an `assert` at its top)
proves that `x` has more than `k` axes. Rewrites run beside the originals in float64."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from engine.extract.package import PackageIndex
from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

BASE = '''
import math
from typing import List

import torch
from torch import nn


class PrepareForMultiHeadAttention(nn.Module):
    def __init__(self, d_model: int, heads: int, d_k: int):
        super().__init__()
        self.linear = nn.Linear(d_model, heads * d_k)
        self.heads = heads
        self.d_k = d_k

    def forward(self, x: torch.Tensor):
        head_shape = x.shape[:-1]
        x = self.linear(x)
        return x.view(*head_shape, self.heads, self.d_k)


class MultiHeadAttention(nn.Module):
    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1):
        super().__init__()
        self.d_k = d_model // heads
        self.heads = heads
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k)
        self.softmax = nn.Softmax(dim={softmax_dim})
        self.output = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout_prob)
        self.scale = 1 / math.sqrt(self.d_k)

    def get_scores(self, query: torch.Tensor, key: torch.Tensor):
        return torch.einsum('ibhd,jbhd->ijbh', query, key)

    def prepare_mask(self, mask: torch.Tensor, query_shape: List[int], key_shape: List[int]):
        assert mask.shape[0] == 1 or mask.shape[0] == query_shape[0]
        assert mask.shape[1] == key_shape[0]
        return mask.unsqueeze(-1)
'''

SUBCLASS = '''
import torch

from lab.mha import MultiHeadAttention
{extra}

class BiasedAttention({bases}):
    def forward(self, *, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor,
                bias: torch.Tensor):
        assert mask.shape[0] == mask.shape[1] and mask.shape[2] == 1
        seq_len, batch_size, _ = query.shape
        mask = self.prepare_mask(mask, query.shape, key.shape)
        query = self.query(query)
        key = self.key(key)
        value = self.value(value)
        scores = self.get_scores(query, key)
        scores *= self.scale
        {add_bias}
        scores = scores.masked_fill(mask == 0, float('-inf'))
        attn = self.softmax(scores)
        attn = self.dropout(attn)
        x = torch.einsum("ijbh,jbhd->ibhd", attn, value)
        x = x.reshape(seq_len, batch_size, -1)
        return self.output(x)
'''

IN_PLACE = "scores += bias[:seq_len, :seq_len, None, :]"


def _write(root: Path, softmax_dim: int = 1, bases: str = "MultiHeadAttention", extra: str = "",
           add_bias: str = IN_PLACE) -> str:
    (root / "lab").mkdir(exist_ok=True)
    (root / "lab" / "__init__.py").write_text("")
    (root / "lab" / "mha.py").write_text(BASE.format(softmax_dim=softmax_dim))
    text = SUBCLASS.format(bases=bases, extra=extra, add_bias=add_bias)
    (root / "lab" / "biased.py").write_text(text)
    return text


def _scan(root: Path, text: str):
    files = [str(p.relative_to(root)) for p in root.rglob("*.py")]
    index = PackageIndex(root, files, lambda rel: rel[:-3].replace("/", ".").removesuffix(".__init__"))
    return scan_source(text, select_rules("sdpa-attention"), "lab/biased.py", "lab.biased", index)


def _original_and_rewritten(tmp_path, monkeypatch, new: str):
    """The package's `lab.biased` and its rewrite (written beside it as `lab.rewritten`), freshly
    imported: the modules a test runs side by side."""
    (tmp_path / "lab" / "rewritten.py").write_text(new)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "lab" or m.startswith("lab.")]:
        monkeypatch.delitem(sys.modules, name)
    return importlib.import_module("lab.biased"), importlib.import_module("lab.rewritten")


def test_an_inherited_scorer_and_softmax_module_are_the_attention(tmp_path, monkeypatch):
    text = _write(tmp_path)
    findings, new = _scan(tmp_path, text)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    # placed at the call in this file, not at the base class's lines
    lines = text.splitlines()
    call = next(i for i, row in enumerate(lines, 1) if "self.get_scores" in row)
    assert findings[0].line == call, findings[0].line
    assert "scaled_dot_product_attention" in new and "self.get_scores" not in new, new
    assert _scan(tmp_path, new)[1] == new  # idempotent
    # the original and the rewrite, same weights, float64, with dropout off
    old_mod, new_mod = _original_and_rewritten(tmp_path, monkeypatch, new)
    torch.manual_seed(0)
    old = old_mod.BiasedAttention(2, 8).double().eval()
    rewritten = new_mod.BiasedAttention(2, 8).double().eval()
    rewritten.load_state_dict(old.state_dict())
    n, b = 5, 3
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, b, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))[:, :, None]
    bias = torch.randn(n + 2, n + 2, 2, generator=gen, dtype=torch.float64)
    want = old(query=q, key=k, value=v, mask=mask, bias=bias)
    got = rewritten(query=q, key=k, value=v, mask=mask, bias=bias)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def _statuses(root: Path, **kwargs) -> list[str]:
    text = _write(root, **kwargs)
    findings, new = _scan(root, text)
    assert all(f.status == "near-miss" for f in findings) == (new == text), findings
    return [f.status for f in findings if f.status != "near-miss"]


def test_a_base_softmax_over_the_query_axis_is_no_attention(tmp_path):
    assert not _statuses(tmp_path, softmax_dim=0)


def test_an_override_of_the_scorer_that_is_no_product_is_no_attention(tmp_path):
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "other.py").write_text('''
import torch

from lab.mha import MultiHeadAttention


class Additive(MultiHeadAttention):
    def get_scores(self, query: torch.Tensor, key: torch.Tensor):
        return query.sum(-1)[:, None] + key.sum(-1)[None]
''')
    assert not _statuses(tmp_path, bases="Additive", extra="from lab.other import Additive\n")


def test_no_inherited_method_through_several_bases(tmp_path):
    # `class C(Mixin, MultiHeadAttention)`: Python looks in the mixin first; not followed
    assert not _statuses(tmp_path, bases="Mixin, MultiHeadAttention",
                         extra="\n\nclass Mixin:\n    pass\n")


def test_a_bias_added_out_of_place_may_add_axes(tmp_path):
    # `scores = scores + bias[...]` broadcasts: a bias of more axes would make more scores axes, and
    # `nn.Softmax(dim=1)` would then be over another axis
    assert not _statuses(tmp_path, add_bias="scores = scores + bias[:seq_len, :seq_len, None, :]")


def test_a_shape_read_that_may_not_run_proves_no_rank(tmp_path):
    # the mask's rank is proven by `mask.shape[2]` in the assert; read only as the second operand of
    # an `or` outside an assert, it may never be read: the mask's axes cannot be moved
    (tmp_path / "lab").mkdir()
    text = _write(tmp_path)
    text = text.replace("        assert mask.shape[0] == mask.shape[1] and mask.shape[2] == 1\n",
                        "        if mask.shape[0] == 1 or mask.shape[2] == 1:\n            pass\n")
    (tmp_path / "lab" / "biased.py").write_text(text)
    findings, new = _scan(tmp_path, text)
    assert new == text and all(f.status == "near-miss" for f in findings), findings
    assert any("no proven rank" in (f.reason or "") for f in findings), [f.reason for f in findings]


CACHED_BIAS = '''if self.alibi_biases is None or self.alibi_biases.shape[1] < seq_len:
            self.alibi_biases = get_alibi_biases(scores.shape[{axis}], mask[:, :, 0, 0])
        scores += self.alibi_biases[:seq_len, :seq_len, None, :]'''

ALIBI_HELPERS = '''

def get_alibi_biases(n_heads: int, mask: torch.Tensor):
    m = torch.pow(2.0 ** (-8.0 / n_heads), torch.arange(1, 1 + n_heads)).to(mask.device)
    distance = mask.cumsum(dim=-1)
    return distance[:, :, None] * m[None, None, :]


class Cached(MultiHeadAttention):
    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1):
        super().__init__(heads, d_model, dropout_prob)
        self.alibi_biases = None
'''


def test_a_read_of_an_axis_of_the_permuted_scores_is_the_querys(tmp_path, monkeypatch):
    # labml's ALiBi: `scores.shape[-1]` of (i, j, b, h) scores is the number of heads, read under the
    # cache's `if`: restated on the query, `query.shape[-2]`, where it stays
    text = _write(tmp_path, bases="Cached", extra=ALIBI_HELPERS, add_bias=CACHED_BIAS.format(axis=-1))
    findings, new = _scan(tmp_path, text)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "get_alibi_biases(query.shape[-2], mask[:, :, 0, 0])" in new, new
    assert _scan(tmp_path, new)[1] == new
    old_mod, new_mod = _original_and_rewritten(tmp_path, monkeypatch, new)
    torch.manual_seed(0)
    old = old_mod.BiasedAttention(3, 12).double().eval()
    rewritten = new_mod.BiasedAttention(3, 12).double().eval()
    rewritten.load_state_dict(old.state_dict())
    n, b = 6, 2
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, b, 12, generator=gen, dtype=torch.float64) for _ in range(3))
    mask = torch.tril(torch.ones(n, n, dtype=torch.bool))[:, :, None]
    for _ in range(2):  # the cache filled, then read
        want = old(query=q, key=k, value=v, mask=mask, bias=None)
        got = rewritten(query=q, key=k, value=v, mask=mask, bias=None)
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_each_axis_of_the_permuted_scores_is_read_where_the_query_has_it(tmp_path):
    # `scores.shape[-2]` of (i, j, b, h) scores is the batch, the query's axis 1 (-3 of 4);
    # `scores.shape[0]` the query's length, its axis 0 (-4)
    for axis, restated in ((-2, "query.shape[-3]"), (0, "query.shape[-4]")):
        text = _write(tmp_path, bases="Cached", extra=ALIBI_HELPERS, add_bias=CACHED_BIAS.format(axis=axis))
        findings, new = _scan(tmp_path, text)
        assert [f.status for f in findings] == ["rewritten"], (axis, [(f.status, f.reason) for f in findings])
        assert f"get_alibi_biases({restated}, mask[:, :, 0, 0])" in new, (axis, new)


def test_an_attention_wholly_in_a_method_of_another_file_is_not_written_from_this_one(tmp_path):
    # the match lies in the base class's `attend`, in lab/base.py: that file's finding; a rewrite at
    # the call would restate code that is not in this file (here a method of the same name, of
    # another class, above the call, is not it)
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "base.py").write_text('''
import torch
from torch import nn


class Base(nn.Module):
    def attend(self, q, k, v):
        w = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        return w @ v
''')
    text = '''
import torch
from torch import nn

from lab.base import Base


class Other(nn.Module):
    def attend(self, q, k, v):
        return q + k + v


class Derived(Base):
    def forward(self, q, k, v):
        out = self.attend(q, k, v)
        return out * 2
'''
    (tmp_path / "lab" / "derived.py").write_text(text)
    files = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py")]
    index = PackageIndex(tmp_path, files, lambda rel: rel[:-3].replace("/", ".").removesuffix(".__init__"))
    findings, new = scan_source(text, select_rules("sdpa-attention"), "lab/derived.py", "lab.derived", index)
    # the base's own scan reports it (once, at its lines); here there is nothing to report
    assert new == text and not findings, [(f.status, f.line, f.reason) for f in findings]


def test_a_shape_read_after_the_name_is_bound_again_is_of_another_value(tmp_path):
    (tmp_path / "lab").mkdir()
    text = _write(tmp_path)
    text = text.replace('''        assert mask.shape[0] == mask.shape[1] and mask.shape[2] == 1
        seq_len, batch_size, _ = query.shape
        mask = self.prepare_mask(mask, query.shape, key.shape)''', '''        given = mask
        mask = torch.ones(1, 1, 1, 1, 1, dtype=torch.bool)
        assert mask.shape[0] == mask.shape[1] and mask.shape[2] == 1
        seq_len, batch_size, _ = query.shape
        mask = self.prepare_mask(given, query.shape, key.shape)''')
    assert "given = mask" in text
    (tmp_path / "lab" / "biased.py").write_text(text)
    findings, new = _scan(tmp_path, text)
    assert new == text and all(f.status == "near-miss" for f in findings), findings
    assert any("no proven rank" in (f.reason or "") for f in findings), [f.reason for f in findings]
