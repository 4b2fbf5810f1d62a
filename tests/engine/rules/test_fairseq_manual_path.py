"""The manual path of fairseq's MultiheadAttention (ESM-2 always takes it: the fused
`F.multi_head_attention_forward` path excludes rotary embeddings).

What it takes to read it as attention: `MultiheadAttention.apply_sparse_mask(w, ...)`, a method
called through its class that returns its argument (inlined as a plain function); `utils_softmax`,
a module helper whose `dim=-1` is a literal bound to its parameter and whose two branches spell one
float32 softmax (`softmax(x.float())` under `onnx_trace`, `softmax(x, dtype=torch.float32)`
otherwise); `assert list(w.size()) == [...]`, a shape check the rewrite removes;
`w = w_float.type_as(w)`, which only names the dtype of the cast before dropout; and
`attn_mask.unsqueeze(0)` under `if attn_mask is not None:`, a None exactly where the mask is.
The original code is kept where the weights are needed (`need_weights`, `before_softmax`), where
the mask is repeated over the scores' batch (`onnx_trace` reads their size) and without a key-padding
mask: its -inf fill goes through a 4-D view of the 3-D scores and back, which the kernel takes with
its operands viewed the same way (`q.unflatten(0, (bsz, self.num_heads))`) and the additive mask
broadcast to the scores and split alike; the rows of a fully padded sample are NaN in both, and an
optional -inf fill beside another mask has no single kernel call yet.
Original against rewritten in float64, the kernel path required to run."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

FAIRSEQ_MHA = """
import torch
import torch.nn.functional as F
from torch import nn


def utils_softmax(x, dim: int, onnx_trace: bool = False):
    if onnx_trace:
        return F.softmax(x.float(), dim=dim)
    else:
        return F.softmax(x, dim=dim, dtype=torch.float32)


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim=16, num_heads=2, dropout=0.0):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = dropout
        self.onnx_trace = False
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key_padding_mask=None, need_weights=True, attn_mask=None, before_softmax=False):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query)
        k = self.k_proj(query)
        v = self.v_proj(query)
        q *= self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        src_len = k.size(1)

        attn_weights = torch.bmm(q, k.transpose(1, 2))
        attn_weights = MultiheadAttention.apply_sparse_mask(attn_weights, tgt_len, src_len, bsz)

        assert list(attn_weights.size()) == [bsz * self.num_heads, tgt_len, src_len]

        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0)
            if self.onnx_trace:
                attn_mask = attn_mask.repeat(attn_weights.size(0), 1, 1)
            attn_weights += attn_mask

        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(
                key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool), float("-inf")
            )
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)

        if before_softmax:
            return attn_weights, v

        attn_weights_float = utils_softmax(attn_weights, dim=-1, onnx_trace=self.onnx_trace)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = F.dropout(attn_weights_float.type_as(attn_weights), p=self.dropout, training=self.training)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        attn = self.out_proj(attn)
        attn_weights = None
        if need_weights:
            attn_weights = attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)
            attn_weights = attn_weights.mean(dim=0)
        return attn, attn_weights

    def apply_sparse_mask(attn_weights, tgt_len: int, src_len: int, bsz: int):
        return attn_weights
"""


def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


def test_the_manual_path_is_rewritten_where_the_weights_are_not_needed(monkeypatch):
    findings, new = _rewrite(FAIRSEQ_MHA)
    assert [f.status for f in findings] == ["guarded"]
    for kept_when in ("need_weights", "before_softmax", "self.onnx_trace", "key_padding_mask is None"):
        assert kept_when in findings[0].guard_text
    assert "attn_mask is None" not in findings[0].guard_text  # a None mask passes through
    assert findings[0].guard_text == "before_softmax or key_padding_mask is None or need_weights or self.onnx_trace"
    kernel = new.split("def forward", 1)[1].split("        else:\n", 1)[1].split("    def apply_sparse_mask", 1)[0]
    assert "apply_sparse_mask" not in kernel and "type_as" not in kernel and "assert" not in kernel
    compile(new, "<rewritten>", "exec")

    original, rewritten = {}, {}
    exec(compile(FAIRSEQ_MHA, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    torch.manual_seed(0)
    a = original["MultiheadAttention"]().double()
    c = rewritten["MultiheadAttention"]().double()
    c.load_state_dict(a.state_dict())
    tgt, bsz = 5, 3
    x = torch.randn(tgt, bsz, 16, dtype=torch.float64)
    additive = torch.randn(tgt, tgt, dtype=torch.float64)
    padding = torch.zeros(bsz, tgt, dtype=torch.bool)
    padding[0, -2:] = True
    cases = [
        ({"need_weights": False}, False),
        ({"need_weights": False, "key_padding_mask": padding}, True),
        ({"need_weights": False, "attn_mask": additive, "key_padding_mask": padding}, True),
        ({"need_weights": True, "attn_mask": additive, "key_padding_mask": padding}, False),
        ({"need_weights": False, "before_softmax": True, "key_padding_mask": padding}, False),
    ]
    for mode in (False, True):  # dropout 0: training changes only the kernel's dropout_p
        a.train(mode), c.train(mode)
        for kwargs, kernel_runs in cases:
            calls.clear()
            xa, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
            out_a, out_c = a(xa, **kwargs), c(xc, **kwargs)
            assert bool(calls) == kernel_runs, kwargs
            for got, want in zip(out_c, out_a, strict=True):
                if want is None:
                    assert got is None
                else:  # the original's softmax runs in float32 (`dtype=torch.float32`), the kernel in float64
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            out_a[0].sum().backward()
            out_c[0].sum().backward()
            torch.testing.assert_close(xc.grad, xa.grad, rtol=1e-5, atol=1e-6)


def test_a_helper_called_through_its_class_that_changes_the_scores_is_read_as_it_is():
    # `apply_sparse_mask` that keeps the lower triangle: not the scores themselves, no attention
    source = FAIRSEQ_MHA.replace("        return attn_weights\n", "        return attn_weights.tril()\n")
    findings, _ = _rewrite(source)
    assert [f.status for f in findings] in ([], ["near-miss"])


def test_a_classmethod_called_through_its_class_is_not_inlined():
    # a classmethod binds its class first: the call's arguments are not its parameters
    source = FAIRSEQ_MHA.replace(
        "    def apply_sparse_mask(attn_weights,", "    @classmethod\n    def apply_sparse_mask(cls, attn_weights,"
    )
    findings, _ = _rewrite(source)
    assert [f.status for f in findings if f.status != "near-miss"] == []


def test_softmax_branches_over_different_axes_are_not_one_value():
    # the `onnx_trace` branch normalizes over another axis: the helper's decision would have to
    # be kept, and the caller cannot state it (fail closed)
    source = FAIRSEQ_MHA.replace("F.softmax(x.float(), dim=dim)", "F.softmax(x.float(), dim=1)")
    findings, _ = _rewrite(source)
    assert [f.status for f in findings] == ["near-miss"]
    assert "softmax dim=1" in findings[0].reason
    source = FAIRSEQ_MHA.replace(
        "            if self.onnx_trace:\n                attn_mask = attn_mask.repeat(attn_weights.size(0), 1, 1)\n", ""
    )
    assert "repeat" not in source
    findings, _ = _rewrite(source)
    assert [f.status for f in findings] == ["guarded"]
    assert "onnx_trace" not in findings[0].guard_text  # the two spellings of the softmax are one


def test_a_mask_changed_by_a_function_under_its_none_test_is_assigned_back():
    # `some_fn(attn_mask)` assigned back to the name on the branch that tests it (scope `_assigned_back`):
    # after the `if` the name holds the function's value where a mask was given and None where not,
    # and the bias is added only on that branch (a None from `some_fn` would make the original's `+=`
    # raise): the kernel takes the name as it stands, so a missing mask needs no guard
    source = FAIRSEQ_MHA.replace("attn_mask = attn_mask.unsqueeze(0)\n", "attn_mask = some_fn(attn_mask)\n")
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["guarded"]
    assert "attn_mask is None" not in findings[0].guard_text
    assert "some_fn(attn_mask)" in new and "if attn_mask is not None" in new


def test_a_literal_whose_negation_is_a_term_of_the_guard_is_dropped():
    from engine.match.scope import _simplify

    x, not_x, b = ("before_softmax", True), ("before_softmax", False), ("need_weights", True)
    assert _simplify([frozenset({x}), frozenset({not_x, b})]) == [frozenset({x}), frozenset({b})]
    assert _simplify([frozenset({x}), frozenset({not_x})]) == [frozenset()]
    assert _simplify([frozenset({x, b}), frozenset({not_x})]) == [frozenset({not_x}), frozenset({b})]


def test_a_method_called_through_its_class_is_inlined_as_a_plain_function():
    from engine.extract.extractor import extract_source

    source = (
        "import torch\nfrom torch import nn\n\n\nclass Base(nn.Module):\n    def forward(self, x):\n"
        "        return self.proj(x)\n\n\nclass M(Base):\n    def __init__(self):\n        super().__init__()\n"
        "        self.proj = nn.Linear(4, 4)\n\n    def forward(self, x):\n        y = M.double(x)\n"
        "        z = Base.forward(self, y)\n        w = M.named(x)\n        return z + w\n\n"
        "    def double(x):\n        return x * 2\n\n    @classmethod\n    def named(cls, x):\n        return x - 1\n"
    )
    model = extract_source(source, "case.py", "case")
    forward = next(m for c in model.classes if c.name == "M" for m in c.methods if m.name == "forward")
    ops = [(n.op, bool(n.via)) for n in forward.nodes]
    assert ("scale", True) in ops  # `M.double(x)`: its body, at the call
    # `Base.forward(self, y)` reads this module's layers and a classmethod binds its class: calls
    assert ("case.Base.forward", False) in ops and ("case.M.named", False) in ops
