"""Two optional fills under independent `if`s (x-clip's attention: `if exists(mask):` a padding fill,
`if self.causal:` a causal one): the root has one full reading per fill, each rewritable behind a
guard. The reading whose original is kept on the fewest paths is chosen (the padding fill, whose
kernel takes the mask where it is set and none where it is None), so the plain path (no mask, not
causal: x-clip's vision tower) runs the kernel with no mask; the causal path without a mask is
rewritten in the next round on the kept original, and only where both fills are made does the
original stay. Each of the four paths is run against the original in float64, a fully masked row
included; readings that are not rewritable (another fill value) or that the code reads elsewhere
keep the original where they must."""

from __future__ import annotations

import pytest

from engine.match.scope import _kept_share
from tests.engine.rules.harness import namespace, scan

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = '''
import torch
import torch.nn as nn
from torch import einsum


def exists(val):
    return val is not None


class Attention(nn.Module):
    def __init__(self, causal, dim_head=8):
        super().__init__()
        self.causal = causal
        self.scale = dim_head ** -0.5
        self.dropout = nn.Dropout(0.1)

    def forward(self, q, k, v, mask=None, rotary_pos_emb=None):
        device = q.device
        q = q * self.scale

        if exists(rotary_pos_emb):
            q, k, v = map(lambda t: t * rotary_pos_emb, (q, k, v))

        sim = einsum('b h i d, b h j d -> b h i j', q, k)

        mask_value = -torch.finfo(sim.dtype).max

        if exists(mask):
            mask = mask[:, None, None, :]
            sim = sim.masked_fill(~mask, mask_value)

        if self.causal:
            i, j = sim.shape[-2:]
            causal_mask = torch.ones((i, j), dtype = torch.bool, device = device).triu(j - i + 1)
            sim = sim.masked_fill(causal_mask, mask_value)

        attn = sim.softmax(dim = -1)

        attn = self.dropout(attn)

        out = einsum('b h i j, b h j d -> b h i d', attn, v)
        return out
'''


def _rewritten(source: str) -> str:
    """The source after as many scans as change it (a scan already rewrites a guarded rewrite's kept
    original in rounds; a further scan must leave it as it is or keep it correct)."""
    for _ in range(4):
        _, new = scan(source)
        if new == source:
            break
        source = new
    return source


def _keep(b=3, n=6):
    keep = torch.ones(b, n, dtype=torch.bool)
    keep[0, -2:] = False
    keep[1] = False  # a fully padded sample: every row of it masks every key
    return keep


def _run(source: str, causal: bool, masked: bool):
    module = namespace(source)["Attention"](causal)
    module.eval()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 6, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = module(q, k, v, _keep() if masked else None)
    out.sum().backward()
    return out, [t.grad for t in (q, k, v)]


def _same_on_every_path(source: str, new: str) -> None:
    for causal in (False, True):
        for masked in (False, True):
            before, before_grads = _run(source, causal, masked)
            after, after_grads = _run(new, causal, masked)
            torch.testing.assert_close(after, before, msg=f"causal={causal} masked={masked}")
            for a, b in zip(after_grads, before_grads, strict=True):
                torch.testing.assert_close(a, b, msg=f"causal={causal} masked={masked}")


def test_the_padding_reading_is_chosen_so_the_plain_path_runs_the_kernel():
    findings, new = scan(SOURCE)
    assert [(f.status, f.guard_text) for f in findings] == [("guarded", "self.causal")]
    body = " ".join(new.split())
    # where the causal fill is not made, one kernel call takes the padding mask where it is given
    # and none where it is None
    assert "else: if exists(mask): mask = mask[:, None, None, :] out = nn.functional.scaled_dot_product_attention(" in body
    assert "attn_mask=None if mask is None else mask | (~mask).all(-1, keepdim=True)" in body
    # the kept original (under `if self.causal:`) is rewritten again where no mask is given: the
    # original stays only where both fills are made
    assert "if self.causal: if exists(mask): sim = einsum(" in body
    assert "attn_mask=~causal_mask | causal_mask.all(-1, keepdim=True)" in body
    assert "exists(mask) or not self.causal" not in body
    assert new.count("scaled_dot_product_attention(") == 2 and new.count("softmax(") == 1


def test_every_path_as_the_original():
    new = _rewritten(SOURCE)
    assert new != SOURCE
    _same_on_every_path(SOURCE, new)


NEAR = {
    # the padding fill writes a value the kernel's boolean mask does not stand for: that reading is
    # no rewrite, and the causal one keeps the original wherever the padding fill is made
    "padding fill of another value": ("sim = sim.masked_fill(~mask, mask_value)", "sim = sim.masked_fill(~mask, 0.5)"),
    # the causal mask is read after the attention: that reading keeps the original where it is made
    "causal mask read later": ("        return out\n", "        if self.causal:\n            out = out + causal_mask.sum()\n        return out\n"),
    # the padding mask, reshaped on its branch, is read after the attention
    "padding mask read later": ("        return out\n", "        if exists(mask):\n            out = out * mask.sum()\n        return out\n"),
}


@pytest.mark.parametrize("change", NEAR.values(), ids=NEAR.keys())
def test_near_misses_keep_the_original_where_they_must(change):
    old, new_text = change
    assert old in SOURCE
    source = SOURCE.replace(old, new_text)
    new = _rewritten(source)
    _same_on_every_path(source, new)
    if "0.5" in new_text:
        # the original stays wherever the padding fill of 0.5 is made
        assert "masked_fill(~mask, 0.5)" in new and "softmax(" in new


def test_kept_share_counts_paths():
    assert _kept_share([]) == 0.0
    assert _kept_share([frozenset({("self.causal", True)})]) == 0.5
    # `exists(mask) or not self.causal`: kept on three paths of four
    assert _kept_share([frozenset({("exists(mask)", True)}), frozenset({("self.causal", False)})]) == 0.75
    assert _kept_share([frozenset({("a", True), ("b", True)})]) == 0.25


def test_a_reading_that_only_trades_one_branch_for_another_is_not_taken():
    # a bias beside the padding fill: no kernel takes that fill's mask as optional (DALLE2's
    # attention), so its reading would only move the kernel from the causal branch to the padded
    # one; the causal reading (the common path of a causal transformer) stays as it was
    source = SOURCE.replace("mask=None, rotary_pos_emb=None", "mask=None, rotary_pos_emb=None, attn_bias=None").replace(
        "        mask_value = -torch.finfo(sim.dtype).max\n",
        "        if exists(attn_bias):\n            sim = sim + attn_bias\n\n        mask_value = -torch.finfo(sim.dtype).max\n")
    findings, new = scan(source)
    assert [(f.status, f.guard_text) for f in findings] == [
        ("guarded", "not (exists(attn_bias)) or exists(mask) or not self.causal")]
    _same_on_every_path(source, new)
