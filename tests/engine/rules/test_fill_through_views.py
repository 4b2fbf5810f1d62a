"""fairseq-style attention on (bsz * heads, n, d) views: the key-padding fill made through a 4-D view
of the 3-D `torch.bmm` scores and back (in place too: `w.view(...)` then `w.masked_fill_(...)`),
additive masks before the views and after them (WavLM's gated position bias, read by
`position_bias.view(attn_weights.size())`), and the probabilities from a helper that adds the masks
in place (Uni-Mol's `softmax_dropout`: `input = input.contiguous()`, `input += bias`, softmax and
dropout). The kernel takes the operands viewed as the fill's view (`q.unflatten(0, (bsz, heads))`),
the fill's mask as it is, and the masks added outside the views broadcast to the 3-D scores' shape
and split the same way. Each rewrite is run against the original in float64, forward and backward,
the kernel path required to run.
"""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

# Uni-Mol v2's Attention: q scaled in place, heads on views, `del` of what the kernel replaces, a
# helper adding the optional mask and a pair bias (never None) in place before softmax and dropout
UNIMOL_V2 = '''
import torch
import torch.nn.functional as F
from torch import nn


def softmax_dropout(input, dropout_prob, is_training=True, mask=None, bias=None, inplace=True):
    input = input.contiguous()
    if not inplace:
        input = input.clone()
    if mask is not None:
        input += mask
    if bias is not None:
        input += bias
    return F.dropout(F.softmax(input, dim=-1), p=dropout_prob, training=is_training)


class Attention(nn.Module):
    def __init__(self, dim=8, pair_dim=3, head_dim=4, num_heads=2, dropout=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.linear_q = nn.Linear(dim, head_dim * num_heads, bias=False)
        self.linear_k = nn.Linear(dim, head_dim * num_heads, bias=False)
        self.linear_v = nn.Linear(dim, head_dim * num_heads, bias=False)
        self.norm = head_dim**-0.5
        self.dropout = dropout
        self.linear_bias = nn.Linear(pair_dim, num_heads)

    def forward(self, q, k, v, pair, mask=None):
        q = self.linear_q(q)
        q *= self.norm
        k = self.linear_k(k)
        v = self.linear_v(v)

        q = q.view(q.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3).contiguous()
        k = k.view(k.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3).contiguous()
        v = v.view(v.shape[:-1] + (self.num_heads, -1)).transpose(-2, -3)

        attn = torch.matmul(q, k.transpose(-1, -2))
        del q, k
        bias = self.linear_bias(pair).permute(0, 3, 1, 2).contiguous()
        attn = softmax_dropout(attn, self.dropout, self.training, mask=mask, bias=bias)
        o = torch.matmul(attn, v)
        del attn, v

        return o.transpose(-2, -3).flatten(-2)
'''

# Uni-Mol's SelfMultiheadAttention: the key-padding fill in place on a 4-D view of the bmm scores,
# the probabilities from the helper, the scores plus the bias returned when `return_attn`
UNIMOL_V1 = UNIMOL_V2.split("class Attention", 1)[0] + '''
class SelfMultiheadAttention(nn.Module):
    def __init__(self, embed_dim=8, num_heads=2, dropout=0.0):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.in_proj = nn.Linear(embed_dim, embed_dim * 3)

    def forward(self, query, key_padding_mask=None, attn_bias=None, return_attn=False):
        bsz, tgt_len, embed_dim = query.size()
        q, k, v = self.in_proj(query).chunk(3, dim=-1)
        q = (
            q.view(bsz, tgt_len, self.num_heads, self.head_dim)
            .transpose(1, 2)
            .contiguous()
            .view(bsz * self.num_heads, -1, self.head_dim)
            * self.scaling
        )
        k = k.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2).contiguous().view(bsz * self.num_heads, -1, self.head_dim)
        v = v.view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2).contiguous().view(bsz * self.num_heads, -1, self.head_dim)
        src_len = k.size(1)

        attn_weights = torch.bmm(q, k.transpose(1, 2))

        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights.masked_fill_(key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool), float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)

        if not return_attn:
            attn = softmax_dropout(attn_weights, self.dropout, self.training, bias=attn_bias)
        else:
            attn_weights += attn_bias
            attn = softmax_dropout(attn_weights, self.dropout, self.training, inplace=False)

        o = torch.bmm(attn, v)
        o = o.view(bsz, self.num_heads, tgt_len, self.head_dim).transpose(1, 2).reshape(bsz, tgt_len, embed_dim)
        if not return_attn:
            return o
        else:
            return o, attn_weights, attn
'''

# fairseq's (WavLM's) manual path: an additive mask added in place to the 3-D scores, the key-padding
# fill through the 4-D view and back, a position bias shaped by the scores' size added after it
WAVLM = '''
import torch
import torch.nn.functional as F
from torch import nn


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim=8, num_heads=2, dropout=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout_module = nn.Dropout(dropout)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key_padding_mask, attn_mask=None, position_bias=None, need_weights=False):
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

        if attn_mask is not None:
            attn_mask = attn_mask.unsqueeze(0)
            attn_weights += attn_mask

        attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
        attn_weights = attn_weights.masked_fill(
            key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool),
            float("-inf"),
        )
        attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)

        if position_bias is not None:
            position_bias = position_bias.view(attn_weights.size())
            attn_weights = attn_weights + position_bias

        attn_weights_float = F.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights_float.type_as(attn_weights)
        attn_probs = self.dropout_module(attn_weights)
        attn = torch.bmm(attn_probs, v)
        attn = attn.transpose(0, 1).reshape(tgt_len, bsz, embed_dim)
        if need_weights:
            return attn, attn_weights_float.view(bsz, self.num_heads, tgt_len, src_len)
        return attn, None
'''


def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or sdpa(*a, **k))
    return calls


def _pair(original: str, rewritten: str, cls: str):
    a, b = {}, {}
    exec(compile(original, "<original>", "exec"), a)  # noqa: S102 - sources written in this file
    exec(compile(rewritten, "<rewritten>", "exec"), b)  # noqa: S102
    torch.manual_seed(0)
    first = a[cls]().double()
    second = b[cls]().double()
    second.load_state_dict(first.state_dict())
    return first, second


def _compare(first, second, inputs: list, kwargs: dict, calls: list, kernel_runs: bool, rows_nan: bool = False):
    """Outputs and the gradients of the inputs and parameters, original against rewritten."""
    results = []
    for module in (first, second):
        calls.clear()
        module.zero_grad()
        xs = [x.clone().requires_grad_() if x.is_floating_point() else x for x in inputs]
        out = module(*xs, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        ran = bool(calls)
        loss = out.nan_to_num(0.0) if rows_nan else out
        (loss * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)).sum().backward()
        results.append((ran, out.detach(), [x.grad for x in xs if x.is_floating_point()],
                        [p.grad for p in module.parameters()]))
    (ran_a, out_a, gx_a, gp_a), (ran_b, out_b, gx_b, gp_b) = results
    assert not ran_a and ran_b == kernel_runs
    torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-10, equal_nan=True)
    if rows_nan:
        return  # the original's v gradient is NaN for a sample holding a NaN row (the rule's known limits)
    for got, want in zip([*gx_b, *gp_b], [*gx_a, *gp_a], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_uni_mol_v2_helper_adding_mask_and_bias_in_place(kernel_calls):
    findings, new = _rewrite(UNIMOL_V2)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    # a tested None of a tensor the function computes is decided: the bias is always added, the mask
    # where it is given; the helper's parameters are what the call passes
    assert "attn_mask=bias if mask is None else mask + bias" in new
    assert "dropout_p=self.dropout if self.training else 0.0" in new and "scale=1.0" in new
    # the names the kernel reads are deleted after it, the scores' not at all
    assert "del q, k\n" not in new and "del attn" not in new and "        del q, k, v\n" in new
    compile(new, "<rewritten>", "exec")
    first, second = _pair(UNIMOL_V2, new, "Attention")
    gen = torch.Generator().manual_seed(1)
    x = [torch.randn(2, 5, 8, generator=gen, dtype=torch.float64) for _ in range(3)]
    pair = torch.randn(2, 5, 5, 3, generator=gen, dtype=torch.float64)
    mask = torch.randn(2, 1, 5, 5, generator=gen, dtype=torch.float64)
    for mode in (False, True):
        first.train(mode), second.train(mode)
        _compare(first, second, [*x, pair], {}, kernel_calls, True)
        _compare(first, second, [*x, pair], {"mask": mask}, kernel_calls, True)


def test_uni_mol_v1_in_place_fill_of_a_view_and_the_helper(kernel_calls):
    findings, new = _rewrite(UNIMOL_V1)
    assert [f.status for f in findings] == ["guarded"], [(f.status, f.reason) for f in findings]
    assert findings[0].guard_text == "key_padding_mask is None or return_attn"
    assert "q.view(bsz, tgt_len" in new and ".unflatten(0, (bsz, self.num_heads))" in new
    # the bias added after the fill, to the 3-D scores, in the kernel's 4-D layout
    assert "attn_bias.expand(bsz * self.num_heads, tgt_len, src_len).unflatten(0, (bsz, self.num_heads))" \
        in " ".join(new.split()).replace("( ", "(").replace(" )", ")")
    first, second = _pair(UNIMOL_V1, new, "SelfMultiheadAttention")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 5, 8, generator=gen, dtype=torch.float64)
    bias = torch.randn(6, 5, 5, generator=gen, dtype=torch.float64)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, -2:] = True
    padding[2, 1] = True
    for mode in (False, True):
        first.train(mode), second.train(mode)
        _compare(first, second, [x], {"key_padding_mask": padding, "attn_bias": bias}, kernel_calls, True)
        _compare(first, second, [x], {"key_padding_mask": padding}, kernel_calls, True)
        _compare(first, second, [x], {"attn_bias": bias}, kernel_calls, False)  # no padding: the original
        _compare(first, second, [x], {"key_padding_mask": padding, "attn_bias": bias, "return_attn": True},
                 kernel_calls, False)
    # a sample whose every key is padding: its rows are NaN in both
    padding[1] = True
    _compare(first, second, [x], {"key_padding_mask": padding, "attn_bias": bias}, kernel_calls, True, rows_nan=True)


def test_fairseq_fill_through_views_with_masks_before_and_after(kernel_calls):
    findings, new = _rewrite(WAVLM)
    assert [f.status for f in findings] == ["guarded"], [(f.status, f.reason) for f in findings]
    # one of the two optional additive masks passes through as None, the other keeps the original
    guard = findings[0].guard_text
    assert guard in ("attn_mask is not None or need_weights", "need_weights or position_bias is None"), guard
    # the scores' size read where the kernel runs is the query's and the key's
    assert "position_bias = position_bias.view(q.size()[:-1] + k.size()[-2:-1])" in new
    compile(new, "<rewritten>", "exec")
    first, second = _pair(WAVLM, new, "MultiheadAttention")
    gen = torch.Generator().manual_seed(3)
    tgt, bsz = 5, 3
    x = torch.randn(tgt, bsz, 8, generator=gen, dtype=torch.float64)
    additive = torch.randn(tgt, tgt, generator=gen, dtype=torch.float64)
    bias = torch.randn(bsz * 2, tgt, tgt, generator=gen, dtype=torch.float64)
    padding = torch.zeros(bsz, tgt, dtype=torch.bool)
    padding[0, -2:] = True
    cases = [{"position_bias": bias}, {"position_bias": bias, "attn_mask": additive}, {"attn_mask": additive}, {},
             {"position_bias": bias, "need_weights": True}]
    for mode in (False, True):
        first.train(mode), second.train(mode)
        for kwargs in cases:
            given = {"attn_mask": None, "position_bias": None, "need_weights": False, **kwargs}
            kept = eval(guard, {}, given)  # noqa: S307 - the finding's guard, over the case's arguments
            _compare(first, second, [x, padding], kwargs, kernel_calls, not kept)


def test_a_mask_added_after_a_finite_fill_is_no_kernel_mask(kernel_calls):
    # a filled key gets -1e9 plus the bias, and a row whose every key is filled is the softmax of the
    # biases there, no average of v: the bias after the fill cannot join the kernel's mask, so the
    # original is kept wherever it is added
    from engine.match import constraints

    source = WAVLM.replace('float("-inf")', "-1e9")
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["guarded"]
    guard = findings[0].guard_text
    assert "position_bias is not None" in guard, guard
    assert "-1e9 plus" not in new  # (the reason the fuller match gave way)
    full = next(m for m, *_ in [(findings[0].match,)] if m is not None)
    assert constraints.CHECKS["mask_after_fill"](full, None) is None  # the match taken adds nothing after it
    first, second = _pair(source, new, "MultiheadAttention")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(5, 3, 8, generator=gen, dtype=torch.float64)
    bias = torch.randn(6, 5, 5, generator=gen, dtype=torch.float64)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[0, -2:] = True
    padding[1] = True  # a finite fill: that sample's rows average v in both
    _compare(first, second, [x, padding], {}, kernel_calls, True)
    _compare(first, second, [x, padding], {"position_bias": bias}, kernel_calls, False)


def test_an_in_place_fill_of_a_view_whose_base_is_read_again_is_no_new_value():
    # `w4.masked_fill_` fills `w` too; the softmax reads `w`: the fill is not lost by the reading
    source = UNIMOL_V1.replace(
        """            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights.masked_fill_(key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool), float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
""",
        """            viewed = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            viewed.masked_fill_(key_padding_mask.unsqueeze(1).unsqueeze(2).to(torch.bool), float("-inf"))
""")
    findings, new = _rewrite(source)
    assert [f.status for f in findings if f.status != "near-miss"] in ([], ["guarded"])
    # where rewritten, the original is kept wherever a padding mask is given
    assert all("key_padding_mask is not None" in (f.guard_text or "") for f in findings if f.status == "guarded")


def test_views_that_do_not_merge_back_around_the_fill_are_no_round_trip():
    source = WAVLM.replace("attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)",
                           "attn_weights = attn_weights.view(bsz, self.num_heads * tgt_len, src_len)")
    findings, new = _rewrite(source)
    assert new == source
    assert [f.status for f in findings] == ["near-miss"]


# BEATs: the query scaled down by alpha, the row maximum of the product subtracted and the
# difference scaled up by alpha again before the masks (a per-row constant the softmax drops)
BEATS = WAVLM.replace(
    "        q *= self.scaling\n",
    "        q *= self.scaling\n        alpha = 32\n        q *= 1 / alpha\n",
).replace(
    "        attn_weights = torch.bmm(q, k.transpose(1, 2))\n",
    "        attn_weights = torch.bmm(q, k.transpose(1, 2))\n"
    "        attn_weights = (attn_weights - attn_weights.max(dim=-1, keepdim=True)[0]) * alpha\n",
)


def test_beats_row_maximum_shift_before_the_masks(kernel_calls):
    assert BEATS.count("alpha") == 3
    findings, new = _rewrite(BEATS)
    assert [f.status for f in findings] == ["guarded"], [(f.status, f.reason) for f in findings]
    assert "scale=alpha" in new and ".max(" not in new.split("else:")[-1]
    guard = findings[0].guard_text
    first, second = _pair(BEATS, new, "MultiheadAttention")
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(5, 3, 8, generator=gen, dtype=torch.float64) * 4
    additive = torch.randn(5, 5, generator=gen, dtype=torch.float64)
    bias = torch.randn(6, 5, 5, generator=gen, dtype=torch.float64)
    padding = torch.zeros(3, 5, dtype=torch.bool)
    padding[2, :3] = True
    for kwargs in ({"position_bias": bias}, {"attn_mask": additive}, {"position_bias": bias, "attn_mask": additive}):
        given = {"attn_mask": None, "position_bias": None, "need_weights": False, **kwargs}
        _compare(first, second, [x, padding], kwargs, kernel_calls, not eval(guard, {}, given))  # noqa: S307


def test_a_row_maximum_over_the_query_axis_is_no_shift():
    source = BEATS.replace("attn_weights.max(dim=-1, keepdim=True)", "attn_weights.max(dim=1, keepdim=True)")
    findings, new = _rewrite(source)
    assert new == source
    assert any("not provably the key axis" in (f.reason or "") for f in findings), [(f.status, f.reason) for f in findings]


@pytest.mark.parametrize(("body", "new_value"), [
    # the viewed tensor has no name left after `w = w.view(...)`: the fill is the filled value
    ("w = w.view(2, 3, 4, 4)\n        w.masked_fill_(m, 0.0)\n        return w", True),
    # `w` still names it (and a read of it would see the fill): the call stays in place
    ("x = w.view(2, 3, 4, 4)\n        x.masked_fill_(m, 0.0)\n        return w", False),
    # another view of it is held: the same
    ("x = w.view(2, 3, 4, 4)\n        y = w.view(6, 4, 4)\n        w = x\n        w.masked_fill_(m, 0.0)\n"
     "        return y", False),
])
def test_an_in_place_fill_of_a_view_is_a_new_value_where_nothing_else_holds_the_tensor(body, new_value):
    from engine.extract.extractor import extract_source

    source = f"import torch\n\n\ndef f(q, k, m):\n        w = torch.bmm(q, k)\n        {body}\n"
    nodes = extract_source(source, "case.py", "case").classes[0].methods[0].nodes
    ops = [n.op for n in nodes]
    assert ("masked_fill" in ops) == new_value and (".masked_fill_" in ops) != new_value, ops
