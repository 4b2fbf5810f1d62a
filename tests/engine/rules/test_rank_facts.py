"""Rank facts for the key's transpose. `k.transpose(2, 3)` swaps the last two axes only where the
key is 4-D. A rank is proven by an unpacking of the key's whole shape into names on every path that
defines it (Llama's `repeat_kv`: `batch, heads, slen, head_dim = hidden_states.shape` raises unless
it is 4-D), and not where the error could be caught. A key of unproven rank (torchtune's Gemma2,
where it comes from a KV cache's `update` or a norm layer passed in) stays a near-miss: the kernel
could only be given `k.transpose(2, 3).transpose(-2, -1)`, a spelling no maintainer would take; its
reason names each node where the proof of the key's rank ends (a module of unknown type, a cache's
`update`) and each parameter of unknown rank the key comes from.
The Llama-like rewrite runs original against rewritten in float64 (to float32 precision: the code's
softmax runs in float32)."""

from __future__ import annotations

import functools

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

GEMMA_LIKE = """
import torch
import torch.nn.functional as F
from torch import nn


class Cache(nn.Module):
    def update(self, k, v):
        return torch.cat([k, k], dim=2), torch.cat([v, v], dim=2)


class GemmaLike(nn.Module):
    def __init__(self, dim=16, heads=4, kv_heads=2, kv_cache=None, k_norm=None, softcapping=None,
                 sliding_window_size=None):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim)
        self.output_proj = nn.Linear(dim, dim)
        self.kv_cache = kv_cache
        self.k_norm = k_norm
        self.softcapping = softcapping
        self.sliding_window_size = sliding_window_size

    def forward(self, x, y, mask=None):
        b, s_x, _ = x.shape
        s_y = y.shape[1]
        q_per_kv = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(b, s_x, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(y).view(b, s_y, self.num_kv_heads, 1, self.head_dim)
        v = self.v_proj(y).view(b, s_y, self.num_kv_heads, 1, self.head_dim)
        if self.num_heads != self.num_kv_heads:
            k = k.expand(b, s_y, self.num_kv_heads, q_per_kv, self.head_dim)
            v = v.expand(b, s_y, self.num_kv_heads, q_per_kv, self.head_dim)
        k = k.reshape(b, s_y, -1, self.head_dim).transpose(1, 2)
        v = v.reshape(b, s_y, -1, self.head_dim).transpose(1, 2)
        if self.k_norm is not None:
            k = self.k_norm(k)
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(k, v)
        q.mul_(self.scaling)
        output = torch.matmul(q, k.transpose(2, 3))
        if mask is None:
            mask = torch.tril(torch.ones(size=(s_x, k.shape[2]), dtype=torch.bool))
        if mask.dtype == torch.bool:
            mask = torch.where(mask.logical_not(), -2.3819763e38, 0)
        if self.sliding_window_size is not None:
            all_ones = torch.ones_like(mask)
            sliding_mask = torch.triu(all_ones, -1 * self.sliding_window_size + 1) * torch.tril(
                all_ones, self.sliding_window_size - 1)
            mask = torch.where(sliding_mask == 1, mask, -2.3819763e38)
        if mask.dim() == 3:
            mask = mask.unsqueeze(1)
        if self.softcapping is not None:
            output = output / self.softcapping
            output = torch.tanh(output)
            output = output * self.softcapping
        output = output + mask
        output = F.softmax(output.float(), dim=-1).type_as(q)
        output = torch.matmul(output, v)
        output = output.transpose(1, 2).contiguous().view(b, s_x, -1)
        return self.output_proj(output)
"""

# the bare product of operands of unknown rank: keys of any rank are the code's own product
ANY_RANK = """
import torch
from torch import nn


class AnyRank(nn.Module):
    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(2, 3)) * 0.5
        return torch.matmul(s.softmax(dim=-1), v)
"""


@functools.cache
def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


def _namespace(source: str) -> dict:
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - test code written in this file
    return namespace


def _near_miss(source: str) -> str:
    findings, new = _rewrite(source)
    assert new == source
    assert [f.status for f in findings] == ["near-miss"]
    return findings[0].reason


def test_gemma2_attention_with_a_key_of_unproven_rank_is_a_near_miss():
    # the key passes through a cache's update and a norm layer passed in: no rank is proven, and
    # transpose(2, 3) is the swap of the last two axes only where it is 4-D
    assert "not provably a swap of the last two dimensions" in _near_miss(GEMMA_LIKE)


def test_a_key_of_any_rank_is_a_near_miss():
    assert "not provably a swap of the last two dimensions" in _near_miss(ANY_RANK)


def test_a_key_of_proven_rank_four_keeps_the_plain_spelling():
    source = ANY_RANK.replace(
        "def forward(self, q, k, v):",
        "def forward(self, q, x, v):\n        k = x.view(x.shape[0], x.shape[1], 4, -1).transpose(1, 2)",
    )
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    assert ".transpose(-2, -1)" not in new.split("scaled_dot_product_attention", 1)[1]


def test_a_join_of_keys_of_different_ranks_proves_no_rank():
    source = ANY_RANK.replace(
        "def forward(self, q, k, v):",
        "def forward(self, q, x, v, wide=False):\n"
        "        if wide:\n"
        "            k = x.view(x.shape[0], x.shape[1], x.shape[2], 2, -1)\n"
        "        else:\n"
        "            k = x.view(x.shape[0], x.shape[1], x.shape[2], -1)",
    )
    assert "not provably a swap of the last two dimensions" in _near_miss(source)


def test_a_key_of_proven_rank_five_stays_a_near_miss():
    source = ANY_RANK.replace(
        "def forward(self, q, k, v):",
        "def forward(self, q, x, v):\n        k = x.view(x.shape[0], x.shape[1], x.shape[2], 2, -1)",
    )
    findings, new = _rewrite(source)
    assert new == source
    assert [f.status for f in findings] == ["near-miss"]
    assert "transpose(2, 3) of a 5-D tensor is not provably a swap" in findings[0].reason


# Llama's layout: the rotary embedding multiplies by `cos` of unknown rank (the key's rank is lost
# there), and `repeat_kv` unpacks the key's shape into four names, which raises unless it is 4-D
LLAMA_LIKE = """
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


class LlamaLike(nn.Module):
    def __init__(self, dim=16, heads=4, kv_heads=2):
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = heads, kv_heads, dim // heads
        self.num_key_value_groups = heads // kv_heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim)

    def forward(self, x, cos, sin, attention_mask=None, past_key_value=None):
        bsz, q_len, _ = x.size()
        q = self.q_proj(x).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, q_len, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        attn_weights = torch.matmul(q, k.transpose(2, 3)) / self.head_dim**0.5
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.matmul(attn_weights, v).transpose(1, 2).reshape(bsz, q_len, -1)
"""


def test_a_key_whose_shape_is_unpacked_into_four_names_is_4d():
    findings, new = _rewrite(LLAMA_LIKE)
    assert [f.status for f in findings] == ["rewritten"]
    kernel = " ".join(new.split("scaled_dot_product_attention(", 1)[1].split())
    assert kernel.startswith("q, k, v,")
    original, rewritten = _namespace(LLAMA_LIKE), _namespace(new)
    for kv_heads in (4, 2):  # repeat_kv returns its input, or the expanded reshape
        torch.manual_seed(0)
        a, b = (
            original["LlamaLike"](kv_heads=kv_heads).double(),
            rewritten["LlamaLike"](kv_heads=kv_heads).double(),
        )
        b.load_state_dict(a.state_dict())
        x = torch.randn(2, 5, 16, dtype=torch.float64)
        cos, sin = torch.randn(1, 1, 5, 4, dtype=torch.float64), torch.randn(1, 1, 5, 4, dtype=torch.float64)
        causal = torch.full((5, 5), float("-inf"), dtype=torch.float64).triu(1)
        for mask in (None, causal):
            # the code's softmax runs in float32 (`dtype=torch.float32`), the kernel's in float64
            torch.testing.assert_close(b(x, cos, sin, mask), a(x, cos, sin, mask), rtol=1e-5, atol=1e-6)


def test_an_unpacking_on_one_branch_only_proves_no_rank():
    source = LLAMA_LIKE.replace(
        "    batch, num_key_value_heads, slen, head_dim = hidden_states.shape\n    if n_rep == 1:\n",
        "    if n_rep == 1:\n",
    ).replace(
        "    hidden_states = hidden_states[:, :, None",
        "    batch, num_key_value_heads, slen, head_dim = hidden_states.shape\n    hidden_states = hidden_states[:, :, None",
    )
    assert source != LLAMA_LIKE
    # the n_rep == 1 path returns the key unproven
    assert "not provably a swap of the last two dimensions" in _near_miss(source)


def test_a_key_unpacked_into_five_names_stays_a_near_miss():
    source = ANY_RANK.replace(
        "def forward(self, q, k, v):",
        "def forward(self, q, k, v):\n        b, h, n, m, d = k.shape",
    )
    findings, new = _rewrite(source)
    assert new == source
    assert [f.status for f in findings] == ["near-miss"]
    assert "transpose(2, 3) of a 5-D tensor is not provably a swap" in findings[0].reason


@pytest.mark.parametrize(
    "wrap",
    [
        "try:\n            b, h, n, d = k.shape\n        except ValueError:\n            pass",
        "with contextlib.suppress(ValueError):\n            b, h, n, d = k.shape",
    ],
)
def test_an_unpacking_whose_error_may_be_caught_proves_no_rank(wrap):
    source = ANY_RANK.replace("import torch\n", "import contextlib\n\nimport torch\n").replace(
        "def forward(self, q, k, v):", "def forward(self, q, k, v):\n        " + wrap
    )
    assert "not provably a swap of the last two dimensions" in _near_miss(source)


def test_a_cache_s_outputs_unpacked_into_four_names_are_4d():
    source = ANY_RANK.replace(
        "def forward(self, q, k, v):",
        "def forward(self, q, k, v, cache):\n        k, v = cache.update(k, v)\n        b, h, n, d = k.shape",
    )
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    assert "k.transpose" not in new


def _line(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_the_near_miss_names_each_node_where_the_key_s_rank_is_lost():
    # the reshape proves 4-D; the norm layer passed in and the cache's update each lose it, and each
    # is said to be whatever the code constructing the module passes
    reason = _near_miss(GEMMA_LIKE)
    assert reason.endswith(
        "is not provably a swap of the last two dimensions: the rank of `k` is not proven past "
        f"`self.k_norm(...)` at line {_line(GEMMA_LIKE, 'self.k_norm(k)')} (from the constructor's parameter "
        f"`k_norm`, of any type) and `self.kv_cache.update(...)` at line {_line(GEMMA_LIKE, 'self.kv_cache.update(k, v)')}"
        " (from the constructor's parameter `kv_cache`, of any type)"
    )


def test_the_near_miss_names_a_key_parameter_of_unknown_rank():
    assert _near_miss(ANY_RANK).endswith(": `k` is a parameter of unknown rank")


# the key comes out of a module of unknown type (`act`, passed in): its rank is lost there
UNKNOWN_MODULE = """
import torch
from torch import nn


class UnknownModule(nn.Module):
    def __init__(self, act, dim=16, heads=4):
        super().__init__()
        self.heads = heads
        self.act = act
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.heads, -1).transpose(1, 2)
        k = self.act(self.k_proj(x).view(b, n, self.heads, -1).transpose(1, 2))
        v = self.v_proj(x).view(b, n, self.heads, -1).transpose(1, 2)
        s = torch.matmul(q, k.transpose(2, 3)) * 0.5
        return torch.matmul(s.softmax(dim=-1), v).transpose(1, 2).reshape(b, n, -1)
"""


def test_a_key_out_of_a_module_of_unknown_type_is_a_near_miss_naming_it():
    reason = _near_miss(UNKNOWN_MODULE)
    line = _line(UNKNOWN_MODULE, "k = self.act(")
    assert reason.endswith(f": the rank of `k` is not proven past `self.act(...)` at line {line} "
                           "(from the constructor's parameter `act`, of any type)")


@pytest.mark.parametrize(
    "key",
    [
        # a view with four explicit sizes is 4-D whatever the module returned
        "k = self.act(self.k_proj(x)).view(b, n, self.heads, -1).transpose(1, 2)",
        # a Linear keeps its input's rank
        "k = self.k_proj(self.q_proj(x).view(b, n, self.heads, -1).transpose(1, 2))",
    ],
)
def test_a_key_of_proven_rank_after_a_module_call_is_rewritten(key):
    source = UNKNOWN_MODULE.replace("k = self.act(self.k_proj(x).view(b, n, self.heads, -1).transpose(1, 2))", key)
    if "self.k_proj(self.q_proj" in key:
        source = source.replace("self.k_proj = nn.Linear(dim, dim)", "self.k_proj = nn.Linear(dim // heads, dim // heads)")
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    assert "k.transpose" not in new
    original, rewritten = _namespace(source), _namespace(new)
    torch.manual_seed(0)
    a = original["UnknownModule"](nn_act := torch.nn.GELU()).double()
    b = rewritten["UnknownModule"](nn_act).double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(b(x), a(x))


def test_a_key_reshaped_in_place_after_its_unpacking_is_a_near_miss():
    # `b, h, n, d = k.shape` proves 4-D before `k.unsqueeze_(0)`; after it the key is 5-D
    source = ANY_RANK.replace(
        "def forward(self, q, k, v):",
        "def forward(self, q, k, v):\n        b, h, n, d = k.shape\n        k.unsqueeze_(0)",
    )
    line = _line(source, "k.unsqueeze_(0)")
    assert _near_miss(source).endswith(f": the rank of `k` is not proven past `.unsqueeze_(...)` at line {line}")


@pytest.mark.parametrize("unpack", [
    "b, h, n, d, device = *k.shape, k.device",
    "device, b, h, n, d, dtype = (k.device, *k.shape, k.dtype)",
    "b, h, n, d = *k.size(), ",
])
def test_a_key_shape_spread_among_other_items_into_four_names_is_4d(unpack):
    """The starred shape takes as many names as the other items leave: four, so the key is 4-D."""
    source = ANY_RANK.replace("def forward(self, q, k, v):", "def forward(self, q, k, v):\n        " + unpack)
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"], [f.reason for f in findings]
    assert ".transpose(-2, -1)" not in new.split("scaled_dot_product_attention", 1)[1]
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    outs = [_namespace(text)["AnyRank"]()(q, k, v) for text in (source, new)]
    torch.testing.assert_close(outs[1], outs[0])
    grads = [torch.autograd.grad(out.sum(), (q, k, v)) for out in outs]
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a)


@pytest.mark.parametrize(("unpack", "reason"), [
    ("b, h, *_ = k.shape", "not provably a swap of the last two dimensions"),  # at least 2-D only
    ("b, *rest, d = k.shape", "not provably a swap of the last two dimensions"),
    ("b, h, n, m, d, device = *k.shape, k.device", "transpose(2, 3) of a 5-D tensor is not provably a swap"),
    ("b, h, n, d = *k.shape[:2], 4, 8", "not provably a swap of the last two dimensions"),  # a slice spread
])
def test_a_starred_unpacking_that_proves_no_four_axes_stays_a_near_miss(unpack, reason):
    source = ANY_RANK.replace("def forward(self, q, k, v):", "def forward(self, q, k, v):\n        " + unpack)
    assert reason in _near_miss(source)


@pytest.mark.parametrize("view", [
    "k = x.view(*x.shape[:2], 4, -1)",
    "k = x.reshape(*x.shape[:-1], 4, -1)",
    "k = x.view((*x.shape[:2], 4, -1))",
    "shape = (*x.shape[:2], 4, -1)\n        k = x.view(shape)",  # listed just before
])
def test_a_view_whose_sizes_spread_a_shape_has_no_rank_of_its_argument_count(view):
    """`x.view(*x.shape[:2], 4, -1)` of a 3-D x is 4-D: the starred item names two sizes, so
    `transpose(1, 2)` of it is no swap of its last two axes (read as 3-D, it was rewritten)."""
    source = ANY_RANK.replace("def forward(self, q, k, v):", f"def forward(self, q, x, v):\n        {view}").replace(
        "k.transpose(2, 3)", "k.transpose(1, 2)")
    assert "not provably a swap of the last two dimensions" in _near_miss(source)
