"""Masks written as in-place fills with a value read from the scores' dtype (dalle-pytorch's
`dots.masked_fill_(mask, max_neg_value(dots))`, `max_neg_value(t)` returning `-torch.finfo(t.dtype).max`).

- An in-place `masked_fill_` on a tensor the function computed, that nothing else holds, is the
  filled value under the same name; on a tensor something else may hold it stays a statement that
  reads the scores (the match escapes).
- A helper that reads only the scores' dtype or device goes with its call when the call only feeds
  the fill, and is called with the query when something the rewrite keeps reads its result.
- 3-D einsum products (`'b i d, b j d -> b i j'`) get the kernel's 4-D views even where the
  operands' shapes are unknown: the spec proves the rank.
Original and rewritten code are compared in float64, with rows whose every key is masked.
"""

from __future__ import annotations

import pytest

from engine.extract import extract_source
from tests.engine.rules.harness import rewrite as _rewrite
from tests.engine.rules.harness import scan as _scan

HEADER = '''
import torch
from torch import nn, einsum


def max_neg_value(t):
    return -torch.finfo(t.dtype).max

'''

PADDED = HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, mask):
        dots = torch.einsum('b h i d, b h j d -> b h i j', q, k) * 0.125
        mask_value = max_neg_value(dots)
        dots.masked_fill_(~mask[:, None, None, :], mask_value)
        attn = dots.softmax(dim=-1)
        return torch.einsum('b h i j, b h j d -> b h i d', attn, v)
'''

# the text part of dalle's sparse attentions: (b h) n d slices, a causal fill, and the fill value
# read again by code the rewrite keeps (here a second attention over other scores)
TEXT_PART = HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, mask):
        q_text, k_text, v_text = q[:, :4], k[:, :4], v[:, :4]
        dots_text = einsum('b i d, b j d -> b i j', q_text, k_text)
        mask_value = max_neg_value(dots_text)
        i, j = dots_text.shape[-2:]
        causal = torch.ones(i, j, device=q.device).triu_(j - i + 1).bool()
        dots_text.masked_fill_(causal, mask_value)
        out_text = einsum('b i j, b j d -> b i d', dots_text.softmax(dim=-1), v_text)
        rest = einsum('b i d, b j d -> b i j', q[:, 4:], k)
        rest.masked_fill_(~mask, mask_value)
        rest = rest.softmax(dim=-1) + rest.mean()
        return out_text, rest
'''

# dalle's Attention: fills under conditions, one value read once for all of them
GUARDED = HEADER + '''
class Attention(nn.Module):
    def forward(self, q, k, v, mask=None, static=None):
        dots = torch.einsum('b h i d, b h j d -> b h i j', q, k) * 0.125
        mask_value = max_neg_value(dots)
        if mask is not None:
            dots.masked_fill_(~mask[:, None, None, :], mask_value)
        if static is not None:
            dots.masked_fill_(~static, mask_value)
        attn = dots.softmax(dim=-1)
        return torch.einsum('b h i j, b h j d -> b h i d', attn, v)
'''


def _unchanged(source: str, reason: str) -> None:
    findings, new = _scan(source)
    assert new == source, new
    assert any(f.status == "near-miss" and reason in (f.reason or "") for f in findings), \
        [(f.status, f.reason) for f in findings]


def test_unaliased_in_place_fill_is_a_new_value():
    model = extract_source(PADDED, "case.py")
    ops = [(n.op, n.outputs) for n in model.classes[0].methods[0].nodes]
    assert ("masked_fill", ("dots.1",)) in ops, ops
    assert not any(op == ".masked_fill_" for op, _ in ops)


def test_padded_in_place_fill_rewrites_and_the_helper_call_goes():
    new = _rewrite(PADDED)
    assert "scaled_dot_product_attention" in new and "masked_fill_" not in new, new
    assert "max_neg_value(dots)" not in new and "mask_value" not in new, new


def test_text_part_restates_the_helper_call_on_the_query_and_views_3d():
    new = _rewrite(TEXT_PART)
    assert "mask_value = max_neg_value(q_text)" in new, new
    assert "i, j = q_text.shape[-2], k_text.shape[-2]" in new, new
    assert "k_text.unsqueeze(0)" in new and ").squeeze(0)" in new, new
    assert "rest.masked_fill_(~mask, mask_value)" in new, new  # the other scores keep their fill


torch = pytest.importorskip("torch")


def _module(source: str):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    return namespace["Attention"]()


def _compare(source: str, make_inputs, train: bool) -> str:
    new = _rewrite(source)
    results = []
    for text in (source, new):
        inputs = make_inputs()
        module = _module(text)
        module.train(train)
        out = module(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape)).sum() for o in outs)
        grads = torch.autograd.grad(loss, [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad])
        results.append(([o.detach() for o in outs], grads))
    (want, want_grads), (got, got_grads) = results
    for a, b in zip([*got, *got_grads], [*want, *want_grads], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{m}\n{new}")
    return new


def _padded_inputs():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 8, generator=gen, dtype=torch.float64, requires_grad=True) for n in (5, 6, 6))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[0, -2:] = False
    mask[1] = False  # a fully padded sample: every row masks every key
    return q, k, v, mask


def _text_inputs():
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(4, 7, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.ones(4, 3, 7, dtype=torch.bool)
    mask[1] = False
    return q, k, v, mask


@pytest.mark.torch
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_padded_fill_with_fully_masked_rows_agrees(train):
    _compare(PADDED, _padded_inputs, train)


@pytest.mark.torch
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_text_part_agrees(train):
    _compare(TEXT_PART, _text_inputs, train)


def test_guarded_fills_keep_the_helper_call_on_the_original_path_only():
    new = _rewrite(GUARDED)
    assert new.count("mask_value = max_neg_value(dots)") == 1 and "max_neg_value(q)" not in new, new


@pytest.mark.torch
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("masks", ["none", "padding", "static", "both"])
def test_guarded_fills_agree(masks, train):
    def inputs():
        q, k, v, mask = _padded_inputs()
        static = torch.ones(5, 6, dtype=torch.bool).tril(1)
        static[2] = False  # a query that keeps no key
        return q, k, v, mask if masks in ("padding", "both") else None, static if masks in ("static", "both") else None

    _compare(GUARDED, inputs, train)


def test_a_helper_reading_the_scores_values_stays():
    source = PADDED.replace("return -torch.finfo(t.dtype).max", "return -t.detach().abs().amax() * 1e4")
    _unchanged(source, "escapes")


@pytest.mark.parametrize("source", [PADDED, TEXT_PART], ids=["padded", "text part"])
def test_a_helper_doing_more_than_reading_the_dtype_stays(source):
    source = source.replace("    return -torch.finfo(t.dtype).max", "    print(t.shape)\n    return -torch.finfo(t.dtype).max")
    _unchanged(source, "escapes")


def test_an_in_place_fill_of_an_aliased_tensor_stays():
    # `seen` is the same tensor: the softmax reads the filled values through it
    source = PADDED.replace("        mask_value = max_neg_value(dots)\n",
                            "        mask_value = max_neg_value(dots)\n        seen = dots\n") \
        .replace("attn = dots.softmax", "attn = seen.softmax")
    model = extract_source(source, "case.py")
    assert any(n.op == ".masked_fill_" for n in model.classes[0].methods[0].nodes)
    _unchanged(source, "escapes")


def test_an_in_place_fill_of_a_view_stays():
    source = PADDED.replace("dots.masked_fill_(", "dots.view(dots.shape).masked_fill_(")
    _unchanged(source, "escapes")


def test_an_in_place_fill_in_a_helper_stays():
    # the helper fills its caller's tensor: its own name for it is not the caller's
    source = PADDED.replace("def max_neg_value(t):", "def fill(t, m):\n    t.masked_fill_(m, -1e9)\n\n\ndef max_neg_value(t):") \
        .replace("dots.masked_fill_(~mask[:, None, None, :], mask_value)", "fill(dots, ~mask[:, None, None, :])")
    _unchanged(source, "escapes")


def test_an_in_place_fill_that_is_not_the_lowest_value_stays():
    source = PADDED.replace("dots.masked_fill_(~mask[:, None, None, :], mask_value)",
                            "dots.masked_fill_(~mask[:, None, None, :], -1.0)")
    _unchanged(source, "is not -inf")
