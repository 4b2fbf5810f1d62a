"""Attention computed in a helper that returns its weights (GPT-2's `_attn`) is rewritten where the
helper is called, guarded on the caller's own reason to need the weights; the helper stays."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, n=6):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n))
        self.attn_dropout = nn.Dropout(0.0)

    def _attn(self, query, key, value, attention_mask=None, head_mask=None):
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.tensor(mask_value, dtype=attn_weights.dtype).to(attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights, mask_value)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        if head_mask is not None:
            attn_weights = attn_weights * head_mask
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights

    def forward(self, x, layer_mask=None, heads=None, output_attentions=False):
        q, k, v = x, x * 0.5, x.flip(-1)
        attn_output, attn_weights = self._attn(q, k, v, layer_mask, heads)
        outputs = (attn_output,)
        if output_attentions:
            outputs += (attn_weights,)
        return outputs
'''


def _load(source):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - the source written above
    return namespace["Attention"]


def _scan(source):
    return scan_source(source, select_rules("sdpa-attention"), "case.py", "case")


def test_the_call_is_rewritten_under_the_callers_condition():
    findings, new = _scan(SOURCE)
    assert [(f.status, f.guard_text) for f in findings] == [("guarded", "heads is not None or output_attentions")]
    assert SOURCE.split("def forward")[0] == new.split("def forward")[0]  # the helper is unchanged
    forward = new.split("def forward")[1]
    assert "scaled_dot_product_attention(" in forward and "attn_weights = None" in forward
    assert "self._attn(q, k, v, layer_mask, heads)" in forward  # kept where the weights are needed
    assert "causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]" in forward
    assert _scan(new)[1] == new  # idempotent

    original, rewritten = _load(SOURCE)(), _load(new)()
    rewritten.load_state_dict(original.state_dict())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 8, generator=gen, dtype=torch.float64)
    pad = torch.zeros(2, 1, 1, 6, dtype=torch.float64)
    pad[0, ..., -2:] = torch.finfo(torch.float64).min
    heads = torch.rand(1, 3, 1, 1, generator=gen, dtype=torch.float64)
    calls = []
    handle = torch.nn.functional.scaled_dot_product_attention
    try:
        torch.nn.functional.scaled_dot_product_attention = lambda *a, **k: calls.append(1) or handle(*a, **k)
        for mask in (None, pad):
            for head in (None, heads):
                for weights in (False, True):
                    got, want = rewritten(x, mask, head, weights), original(x, mask, head, weights)
                    assert len(got) == len(want)
                    for a, b in zip(got, want, strict=True):
                        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    finally:
        torch.nn.functional.scaled_dot_product_attention = handle
    assert len(calls) == 2  # the kernel ran where neither head mask nor weights were asked for


def test_arguments_are_read_in_the_callers_terms():
    # the caller passes its `heads` as the helper's attention mask and its mask as the head mask
    source = SOURCE.replace("self._attn(q, k, v, layer_mask, heads)", "self._attn(q, k, v, heads, layer_mask)")
    findings, new = _scan(source)
    assert [(f.status, f.guard_text) for f in findings] == [("guarded", "layer_mask is not None or output_attentions")]
    assert "+ (heads if heads is not None else 0)" in new.split("def forward")[1]


@pytest.mark.parametrize("change, to, reason", [
    ("        attn_output = torch.matmul(attn_weights, value)\n",
     "        attn_output = torch.matmul(attn_weights, value)\n        self.last = attn_weights\n",
     "escapes the match: stored"),
    ("        query_length, key_length = query.size(-2), key.size(-2)\n",
     "        query_length, key_length = query.size(-2), key.size(-2)\n        if query_length > 3:\n"
     "            key_length = key.size(-2)\n",
     "`key_length` is chosen by a branch or a loop of the helper `_attn`"),
    ("        attn_output = torch.matmul(attn_weights, value)\n",
     "        attn_output = torch.matmul(attn_weights, value)\n        print(attn_output)\n",
     "has a statement whose effect the kernel path would skip"),
])
def test_a_helper_the_call_cannot_stand_for_is_left_with_its_reason(change, to, reason):
    source = SOURCE.replace(change, to)
    findings, new = _scan(source)
    assert new == source
    assert [f.status for f in findings] == ["near-miss"], [(f.status, f.reason) for f in findings]
    assert reason in findings[0].reason


def test_a_caller_that_always_reads_the_weights_is_not_rewritten():
    source = SOURCE.replace("        if output_attentions:\n            outputs += (attn_weights,)\n",
                            "        outputs += (attn_weights,)\n")
    findings, new = _scan(source)
    assert new == source
    assert [f.status for f in findings] == ["near-miss"]


def test_a_parameter_left_at_its_default_decides_the_helpers_condition():
    # no head mask passed: the helper's `head_mask is not None` is `None is not None` at this call,
    # false, so it is no reason to keep the original
    source = SOURCE.replace("self._attn(q, k, v, layer_mask, heads)", "self._attn(q, k, v, layer_mask)")
    findings, new = _scan(source)
    assert [(f.status, f.guard_text) for f in findings] == [("guarded", "output_attentions")]
    original, rewritten = _load(source)(), _load(new)()
    x = torch.randn(2, 3, 6, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for weights in (False, True):
        for a, b in zip(rewritten(x, None, None, weights), original(x, None, None, weights), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


BIAS_SOURCE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, n=6, heads=2):
        super().__init__()
        self.scale = 8 ** -0.5
        self.pos_bias = nn.Embedding(n * n, heads)
        self.register_buffer("pos_indices", torch.arange(n * n).view(n, n))
        self.attend = nn.Softmax(dim=-1)

    def apply_pos_bias(self, fmap):
        bias = self.pos_bias(self.pos_indices)
        bias = bias.permute(2, 0, 1).unsqueeze(0)
        return fmap + (bias / self.scale)

    def forward(self, q, k, v):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        dots = self.apply_pos_bias(dots)
        attn = self.attend(dots)
        return torch.matmul(attn, v)
'''


def test_a_bias_added_by_a_helper_becomes_the_kernels_mask():
    # levit: the scores go through `self.apply_pos_bias`, which adds a learned bias; the call goes,
    # the bias (in the caller's terms) is the kernel's mask, and the helper stays
    findings, new = _scan(BIAS_SOURCE)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "self.apply_pos_bias(dots)" not in new and "def apply_pos_bias(self, fmap):" in new
    assert "self.pos_bias(self.pos_indices).permute(2, 0, 1).unsqueeze(0) / self.scale" in " ".join(new.split())
    original, rewritten = _load(BIAS_SOURCE)(), _load(new)()
    rewritten.load_state_dict(original.state_dict())
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 6, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    original.double(), rewritten.double()
    torch.testing.assert_close(rewritten(q, k, v), original(q, k, v), rtol=1e-10, atol=1e-10)
    grads = [torch.autograd.grad(m(q, k, v).sum(), m.pos_bias.weight)[0] for m in (original, rewritten)]
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-10, atol=1e-10)
    assert _scan(new)[1] == new
