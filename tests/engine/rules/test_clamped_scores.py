"""OPT's attention: the masked scores clamped at their dtype's lowest value
(`torch.max(w, torch.tensor(torch.finfo(w.dtype).min))`) and a softmax whose spelling a dtype test
chooses (`softmax(w, dim=-1, dtype=torch.float32).to(torch.float16)` for half scores, `softmax(w,
dim=-1)` otherwise).

The clamp changes only -inf entries (a -inf in the mask, as transformers 4.34's causal + padding
sum `finfo.min + finfo.min` gives, or `w + finfo.min` overflowing), so the kernel, which adds its
mask itself, gets the mask clamped the same way. The two softmax spellings are one normal form (the
softmax of the scores in at least float32, given back in their dtype), so the rewrite covers both
branches and drops the test. Each case runs original against rewritten: float64 and float32 (and
bfloat16) with padding, causal + padding (the -inf sum), a fully padded sample and a padded query
row (every key masked: the original averages v over all keys there), eval and train; the weights
returned and the head mask keep the original."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

OPT_LIKE = '''
import torch
import torch.nn as nn


class OPTLike(nn.Module):
    def __init__(self, dim=16, heads=2, dropout=0.0):
        super().__init__()
        self.num_heads = heads
        self.head_dim = dim // heads
        self.scaling = self.head_dim ** -0.5
        self.dropout = dropout
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)

    def forward(self, x, attention_mask=None, layer_head_mask=None, output_attentions=False):
        bsz, tgt_len, _ = x.shape
        proj_shape = (bsz * self.num_heads, -1, self.head_dim)
        q = (self.q_proj(x) * self.scaling).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)
        q = q.reshape(*proj_shape)
        k = self.k_proj(x).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        v = self.v_proj(x).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(*proj_shape)
        src_len = k.size(1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attention_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + attention_mask
            attn_weights = torch.max(attn_weights, torch.tensor(torch.finfo(attn_weights.dtype).min))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        if attn_weights.dtype == torch.float16:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(torch.float16)
        else:
            attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        if layer_head_mask is not None:
            attn_weights = layer_head_mask.view(1, -1, 1, 1) * attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        if output_attentions:
            attn_weights_reshaped = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights_reshaped.view(bsz * self.num_heads, tgt_len, src_len)
        else:
            attn_weights_reshaped = None
        attn_probs = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
        out = torch.bmm(attn_probs, v)
        out = out.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2).reshape(bsz, tgt_len, -1)
        return out, attn_weights_reshaped
'''

CLAMPED_MASK = "torch.max(attention_mask, torch.tensor(torch.finfo(attention_mask.dtype).min))"


def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


def _modules(new: str, dtype, dropout=0.0):
    original, rewritten = {}, {}
    exec(compile(OPT_LIKE, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    torch.manual_seed(0)
    a = original["OPTLike"](dropout=dropout).to(dtype)
    b = rewritten["OPTLike"](dropout=dropout).to(dtype)
    b.load_state_dict(a.state_dict(), strict=True)
    return a, b


def _masks(bsz: int, n: int, dtype):
    """transformers 4.34's OPT masks: padding expanded to finfo.min, plus the causal finfo.min
    (a key both future and padded sums to -inf), with a left-padded sample, a fully padded one and
    one query row whose every key is masked. Also the rows whose every key is masked."""
    lowest = torch.finfo(dtype).min
    causal = torch.full((n, n), lowest, dtype=dtype).triu(1)[None, None].expand(bsz, 1, n, n)
    padding = torch.zeros(bsz, 1, 1, n, dtype=dtype)
    padding[0, ..., :2] = lowest  # left padding: its first two queries see only masked keys
    padding[1] = lowest  # a fully padded sample
    padding = padding.expand(bsz, 1, n, n).clone()
    padding[2, :, -1, :] = lowest  # a padded query row of a query x key mask
    masks = {"padding": padding, "causal + padding": causal + padding, "causal": causal.clone()}
    return {name: (m, (m <= lowest).all(-1)) for name, m in masks.items()}


def test_opt_attention_is_rewritten_with_the_mask_clamped_and_one_softmax():
    findings, new = _rewrite(OPT_LIKE)
    assert [(f.status, f.guard_text) for f in findings] == [("guarded", "layer_head_mask is not None or output_attentions")]
    kernel = new.split("scaled_dot_product_attention", 1)[1]
    assert CLAMPED_MASK in new and ".dtype == torch.float16" not in new.split("else:")[-1]
    assert "attn_mask=" + CLAMPED_MASK + " if attention_mask is not None else None" in " ".join(kernel.split())
    again, newer = _rewrite(new)
    assert newer == new


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_every_row_keeps_the_original_value_and_gradient_where_a_key_is_kept(dtype):
    _, new = _rewrite(OPT_LIKE)
    a, b = _modules(new, dtype)
    bsz, n = 3, 6
    # float32: the kernel sums in another order; errors relative to each tensor's scale
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    x = torch.randn(bsz, n, 16, dtype=dtype) * 4
    for mode in ("eval", "train"):  # dropout 0: training changes only the kernel's dropout_p
        a.train(mode == "train")
        b.train(mode == "train")
        for name, (mask, rows) in [*_masks(bsz, n, dtype).items(), ("none", (None, None))]:
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            out_a, weights_a = a(xa, mask)
            out_b, weights_b = b(xb, mask)
            assert weights_a is None and weights_b is None
            # the forward on every row, fully masked ones too (the uniform average of v)
            torch.testing.assert_close(out_b, out_a, **tol, msg=lambda m, name=name: f"{name}: {m}")
            # the gradient of a loss that reads the rows with a kept key (on a row with none, the
            # original's torch.max ties pass half the gradient through; see the rule's known limits)
            weight = torch.randn(out_a.shape, dtype=dtype)
            if rows is not None:
                weight = weight.masked_fill(rows.any(1)[..., None], 0)
            (out_a * weight).sum().backward()
            (out_b * weight).sum().backward()
            for ga, gb in [(xa.grad, xb.grad), *((pa.grad, pb.grad) for pa, pb in zip(a.parameters(), b.parameters(),
                                                                                         strict=True))]:
                scale = ga.abs().max().clamp(min=1)
                torch.testing.assert_close(gb / scale, ga / scale, **tol, msg=lambda m, name=name: f"{name} grad: {m}")
            a.zero_grad()
            b.zero_grad()


def test_the_raw_mask_would_differ_on_the_fully_masked_rows():
    """The clamp is what makes the fully masked rows exact: without it, the kernel drops the -inf keys
    of a padded query's row (a uniform average over the others) where the original averages all."""
    _, new = _rewrite(OPT_LIKE)
    raw = new.replace(CLAMPED_MASK + " if attention_mask is not None else None", "attention_mask")
    raw = raw.replace(CLAMPED_MASK, "attention_mask")
    assert raw != new
    a, b = _modules(raw, torch.float32)
    mask, rows = _masks(3, 6, torch.float32)["causal + padding"]
    x = torch.randn(3, 6, 16)
    with torch.no_grad():
        diff = (b(x, mask)[0] - a(x, mask)[0]).abs().amax(-1)
    assert diff[~rows.any(1)].max() < 1e-5 and diff[rows.any(1)].max() > 1e-2


def test_bfloat16_rows_agree_to_its_precision():
    _, new = _rewrite(OPT_LIKE)
    a, b = _modules(new, torch.bfloat16)
    ref, _ = _modules(new, torch.float64)
    x = torch.randn(3, 6, 16)
    for name, (mask, _) in _masks(3, 6, torch.bfloat16).items():
        with torch.no_grad():
            out_a, out_b = a(x.bfloat16(), mask)[0].double(), b(x.bfloat16(), mask)[0].double()
        # the rewrite is no further from the original than bfloat16 rounding of one average
        torch.testing.assert_close(out_b, out_a, rtol=2e-2, atol=2e-2, msg=lambda m, name=name: f"{name}: {m}")


def test_weights_or_head_mask_keep_the_original_and_dropout_runs_in_training_only():
    _, new = _rewrite(OPT_LIKE)
    a, b = _modules(new, torch.float64, dropout=0.5)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask, _ = _masks(3, 5, torch.float64)["causal + padding"]
    mask = mask[:2]
    a.eval()
    b.eval()
    out_a, w_a = a(x, mask, output_attentions=True)
    out_b, w_b = b(x, mask, output_attentions=True)
    torch.testing.assert_close(out_b, out_a) and torch.testing.assert_close(w_b, w_a)
    heads = torch.tensor([1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(b(x, mask, heads)[0], a(x, mask, heads)[0])
    torch.testing.assert_close(b(x, mask)[0], a(x, mask)[0], rtol=1e-10, atol=1e-12)
    b.train()
    torch.manual_seed(1)
    dropped = b(x, mask)[0]
    assert not torch.allclose(dropped, a(x, mask)[0])  # training drops, as the original does


def _variant(old: str, new: str) -> str:
    assert old in OPT_LIKE
    return OPT_LIKE.replace(old, new)


@pytest.mark.parametrize("source", [
    # a clamp at another bound than the scores' own lowest value is no mask's
    _variant("torch.tensor(torch.finfo(attn_weights.dtype).min)", "torch.tensor(-1e4)"),
    _variant("torch.tensor(torch.finfo(attn_weights.dtype).min)",
             "torch.tensor(torch.finfo(attn_weights.dtype).min, dtype=torch.float64)"),
    _variant("torch.finfo(attn_weights.dtype)", "torch.finfo(x.dtype)"),
])
def test_another_clamp_keeps_the_original_where_the_mask_is_added(source):
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["guarded"] and "attention_mask is not None" in findings[0].guard_text
    assert "attn_mask" not in new and "torch.max(attention_mask" not in new


@pytest.mark.parametrize("old, new", [
    # the half branch casts to another dtype than the one its test proves
    ("dtype=torch.float32).to(torch.float16)", "dtype=torch.float32).to(torch.bfloat16)"),
    # the branches normalize over different axes
    ("softmax(attn_weights, dim=-1)\n", "softmax(attn_weights, dim=1)\n"),
    # the test is on another dtype than the one the branch casts to
    ("if attn_weights.dtype == torch.float16:", "if attn_weights.dtype == torch.bfloat16:"),
    # the test reads another tensor
    ("if attn_weights.dtype == torch.float16:", "if x.dtype == torch.float16:"),
])
def test_a_dtype_choice_that_is_not_one_softmax_keeps_the_original(old, new):
    source = _variant(old, new)
    findings, rewritten = _rewrite(source)
    assert findings and all(f.status in ("near-miss", "guarded") for f in findings)
    for f in findings:
        # never one kernel for both branches: the test stays in the guard, or nothing is rewritten
        assert f.status == "near-miss" or "dtype" in (f.guard_text or ""), (f.status, f.guard_text)
