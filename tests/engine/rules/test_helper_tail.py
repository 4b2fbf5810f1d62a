"""Attention whose scores the caller hands to a helper, written at the helper's call (funasr's SANM
export classes): the helper's statements after the product are repeated in the caller as
statements (`context_layer = <kernel>`, `context_layer = context_layer.permute(...)`, a shape read
from it, the view), so a value the helper reads twice is read by its name; a read of the scores'
device in the helper (`mask.to(scores.device)`) is the query's at the call; a call inside a tuple
the caller returns (`return self.forward_attention(...), cache`) keeps the tuple; and two classes of
one name (the first shadowed by the second) are both rewritten. Original and rewritten are compared
in float64, forward and backward."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import math
import torch
import torch.nn as nn
"""

EXPORT = '''
class Export(nn.Module):
    def __init__(self, n_head, d):
        super().__init__()
        self.h = n_head
        self.d_k = d // n_head
        self.all_head_size = d
        self.linear_q = nn.Linear(d, d)
        self.linear_k_v = nn.Linear(d, 2 * d)
        self.linear_out = nn.Linear(d, d)

    def forward(self, x, memory, memory_mask, ret_attn=False):
        q, k, v = self.forward_qkv(x, memory)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        return self.forward_attention(v, scores, memory_mask, ret_attn)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.h, self.d_k)
        x = x.view(new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward_qkv(self, x, memory):
        q = self.linear_q(x)
        k, v = torch.split(self.linear_k_v(memory), int(self.h * self.d_k), dim=-1)
        return self.transpose_for_scores(q), self.transpose_for_scores(k), self.transpose_for_scores(v)

    def forward_attention(self, value, scores, mask, ret_attn):
        scores = scores + mask.to(scores.device)

        attn = torch.softmax(scores, dim=-1)
        context_layer = torch.matmul(attn, value)

        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)
        context_layer = context_layer.view(new_context_layer_shape)
        if ret_attn:
            return self.linear_out(context_layer), attn
        return self.linear_out(context_layer)
'''

CHUNK = '''
class Export(nn.Module):
    def __init__(self, n_head, d):
        super().__init__()
        self.h = n_head
        self.d_k = d // n_head
        self.linear_q = nn.Linear(d, d)
        self.linear_k_v = nn.Linear(d, 2 * d)
        self.linear_out = nn.Linear(d, d)
        self.dropout = nn.Dropout(0.0)

    def forward_qkv(self, x, memory):
        b = x.size(0)
        q_h = torch.reshape(self.linear_q(x), (b, -1, self.h, self.d_k)).transpose(1, 2)
        k, v = torch.split(self.linear_k_v(memory), int(self.h * self.d_k), dim=-1)
        k_h = torch.reshape(k, (b, -1, self.h, self.d_k)).transpose(1, 2)
        v_h = torch.reshape(v, (b, -1, self.h, self.d_k)).transpose(1, 2)
        return q_h, k_h, v_h

    def forward_attention(self, value, scores, mask):
        n_batch = value.size(0)
        if mask is not None:
            scores = scores + mask
        attn = torch.softmax(scores, dim=-1)
        p_attn = self.dropout(attn)
        x = torch.matmul(p_attn, value)
        x = x.transpose(1, 2).contiguous().view(n_batch, -1, self.h * self.d_k)
        return self.linear_out(x)

    def forward(self, x, memory, memory_mask=None, cache=None):
        q_h, k_h, v_h = self.forward_qkv(x, memory)
        if cache is not None:
            k_h = torch.cat((cache["k"], k_h), dim=2)
            v_h = torch.cat((cache["v"], v_h), dim=2)
        cache = {"k": k_h, "v": v_h}
        q_h = q_h * self.d_k ** (-0.5)
        scores = torch.matmul(q_h, k_h.transpose(-2, -1))
        return self.forward_attention(v_h, scores, None), cache
'''


def _run(module, x, memory, *args):
    xa = x.clone().requires_grad_()
    out = module(xa, memory, *args)
    first = out[0] if isinstance(out, tuple) else out
    weight = torch.randn(first.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    (first * weight).sum().backward()
    return out, xa.grad, [p.grad for p in module.parameters()]


def _compare(original: dict, rewritten: dict, *args, name: str = "Export") -> None:
    torch.manual_seed(0)
    a = original[name](4, 16).double()
    b = rewritten[name](4, 16).double()
    b.load_state_dict(a.state_dict())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, dtype=torch.float64, generator=g)
    memory = torch.randn(3, 7, 16, dtype=torch.float64, generator=g)
    out_a, grad_a, params_a = _run(a, x, memory, *args)
    out_b, grad_b, params_b = _run(b, x, memory, *args)
    torch.testing.assert_close(out_b, out_a, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_b, grad_a, rtol=1e-10, atol=1e-12)
    for pa, pb in zip(params_a, params_b, strict=True):
        torch.testing.assert_close(pb, pa, rtol=1e-10, atol=1e-12)


def _mask():
    m = torch.zeros(3, 1, 5, 7, dtype=torch.float64)
    m[0, :, :, 4:] = -10000.0  # padded keys of the first sample, as funasr's export masks
    m[1] = torch.randn(1, 5, 7, dtype=torch.float64)  # any additive bias
    return m


def test_the_helpers_statements_are_repeated_in_the_caller():
    source = HEADER + EXPORT
    new = rewrite(source)
    forward = new.split("def forward(", 1)[1].split("def transpose_for_scores", 1)[0]
    assert forward.count("scaled_dot_product_attention(") == 1
    # the shape read from the result and the view are the helper's own statements, by name
    assert "new_context_layer_shape = context_layer.size()[:-2] + (self.all_head_size,)" in forward
    assert "context_layer = context_layer.view(new_context_layer_shape)" in forward
    # the helper's read of the scores' device is the query's
    assert "attn_mask=memory_mask.to(q.device)" in forward and "scores.device" not in forward
    # the probabilities are returned only when asked: the original stays under that flag
    assert "if ret_attn:" in forward
    assert statuses(new)[1] == new  # idempotent
    original, rewritten = namespace(source), namespace(new)
    _compare(original, rewritten, _mask())
    _compare(original, rewritten, _mask(), True)


def test_two_classes_of_one_name_are_both_rewritten():
    # funasr defines MultiHeadedAttentionSANMExport twice; the first is shadowed but still code
    source = HEADER + EXPORT + EXPORT
    new = rewrite(source)
    assert new.count("scaled_dot_product_attention(") == 2
    first_old, first_new = (text.rsplit("\nclass Export(", 1)[0] for text in (source, new))
    _compare(namespace(first_old), namespace(first_new), _mask())
    _compare(namespace(source), namespace(new), _mask())


def test_a_call_inside_the_returned_tuple_keeps_the_tuple():
    source = HEADER + CHUNK
    new = rewrite(source)
    forward = new.split("    def forward(", 1)[1]
    assert "forward_attention(" not in forward
    assert forward.rstrip().endswith("return self.linear_out(x), cache")
    original, rewritten = namespace(source), namespace(new)
    _compare(original, rewritten)
    torch.manual_seed(0)
    a, b = original["Export"](4, 16).double(), rewritten["Export"](4, 16).double()
    b.load_state_dict(a.state_dict())
    x, memory = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 3, 16, dtype=torch.float64)
    _, cache_a = a(x, memory)
    _, cache_b = b(x, memory)
    (out_a, cache_a), (out_b, cache_b) = a(x, memory, None, cache_a), b(x, memory, None, cache_b)
    torch.testing.assert_close(out_b, out_a)
    torch.testing.assert_close(cache_b["k"], cache_a["k"])


def test_a_call_beside_another_call_in_its_statement_is_not_rewritten():
    # `return self.forward_attention(...), self.step(x)`: moving the helper's statements before the
    # statement would run them before the other call
    source = HEADER + CHUNK.replace("return self.forward_attention(v_h, scores, None), cache",
                                    "return self.forward_attention(v_h, scores, None), self.linear_q(x)")
    found, new = statuses(source)
    assert new == source
    assert any("not assigned or returned by a statement of its own" in (reason or "") for _, reason in found), found
