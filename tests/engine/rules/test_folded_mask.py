"""A mask added through a round trip of views that split the scores' leading axis (shifted-window
attention: `attn.view(B_ // nW, nW, H, N, N) + mask.unsqueeze(1).unsqueeze(0)`, then
`attn.view(-1, H, N, N)`) is that mask broadcast to the split axes and those flattened: one kernel
call takes it folded into the scores' layout, and where the mask is optional (`if mask is not
None:` around the views, a softmax on each branch) the tested variable is assigned the folded mask
on its branch and the one kernel call after the merge takes it (None on the other branch). Original
against rewritten in float64, forward and gradients, mask given and None, eval and train mode (the
dropout's probability 0 in train mode, so both draw nothing); a split in the other order is another
mapping, and the fold follows it."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import namespace, rewrite, statuses

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

HEADER = """
import torch
import torch.nn as nn
import torch.nn.functional as F
"""

INIT = '''
class WindowAttention(nn.Module):
    def __init__(self, dim=16, num_heads=2, window=4, drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        self.window = window
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.table = nn.Parameter(torch.randn(window ** 4, num_heads))
        self.softmax = nn.Softmax(dim=-1)
        self.attn_drop = nn.Dropout(drop)
'''

QKV = '''
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        bias = self.table.view(self.window ** 2, self.window ** 2, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
'''

TAIL = '''
        attn = self.attn_drop(attn)
        return (attn @ v).transpose(1, 2).reshape(B_, N, C)
'''

# mmpretrain WindowMSA, espnet and the original Swin: a softmax on each branch
OPTIONAL = HEADER + INIT + "\n    def forward(self, x, mask=None):" + QKV + '''
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
''' + TAIL

# davit: no bias before the views, the mask read by an index
NO_BIAS = OPTIONAL.replace("        attn = attn + bias.unsqueeze(0)\n", "").replace(
    "mask.unsqueeze(1).unsqueeze(0)", "mask[None, :, None]")

# always masked, each view a statement of its own
ALWAYS = HEADER + INIT + "\n    def forward(self, x, mask):" + QKV + '''
        nW = mask.shape[0]
        attn = attn.view(B_ // nW, nW, self.num_heads, N, N)
        attn = attn + mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, self.num_heads, N, N)
        attn = self.softmax(attn)
''' + TAIL

# the windows split the other way: window index slowest, the mask broadcast over the second axis
WINDOW_MAJOR = HEADER + INIT + "\n    def forward(self, x, mask=None):" + QKV + '''
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(nW, B_ // nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(1)
            attn = attn.view(-1, self.num_heads, N, N)
            attn = self.softmax(attn)
        else:
            attn = self.softmax(attn)
''' + TAIL


def _mask(windows=4, n=16):
    g = torch.Generator().manual_seed(3)
    # Swin's shifted-window mask: 0 or -100; one window masks every key of a row but the first
    mask = torch.zeros(windows, n, n, dtype=torch.float64).masked_fill(torch.rand(windows, n, n, generator=g) < 0.3, -100.0)
    mask[1, 2, 1:] = -100.0
    return mask


def _run(source: str, mask, training: bool):
    torch.manual_seed(0)
    module = namespace(source)["WindowAttention"]().double().train(training)
    x = torch.randn(8, 16, 16, dtype=torch.float64, requires_grad=True)
    out = module(x, mask)
    out.sum().backward()
    return [out, x.grad, module.table.grad, module.qkv.weight.grad]


def _same(source: str, new: str, mask, training: bool) -> None:
    for after, before in zip(_run(new, mask, training), _run(source, mask, training), strict=True):
        torch.testing.assert_close(after, before)


@pytest.mark.parametrize("source", [OPTIONAL, NO_BIAS, WINDOW_MAJOR], ids=["bias", "no-bias", "window-major"])
@pytest.mark.parametrize("given", [True, False], ids=["masked", "no-mask"])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_optional_mask_folded_on_its_branch(source, given, training):
    found, new = statuses(source)
    assert [status for status, _ in found] == ["rewritten"], found
    assert new.count("scaled_dot_product_attention(") == 1
    assert "softmax" not in new.partition("def forward")[2] and "@" not in new  # no attention left on a branch
    assert ".flatten(0, 1)" in new.split("if mask is not None:")[1].split("return")[0]  # folded under the `if`
    _same(source, new, _mask() if given else None, training)


def test_the_fold_names_the_split_sizes_in_their_order():
    assert "mask = mask.unsqueeze(1).unsqueeze(0).expand(B_ // nW, nW, -1, -1, -1).flatten(0, 1)" in rewrite(OPTIONAL)
    assert "mask.unsqueeze(1).unsqueeze(1).expand(nW, B_ // nW, -1, -1, -1).flatten(0, 1)" in rewrite(WINDOW_MAJOR)
    new = rewrite(NO_BIAS)
    assert "attn_mask=mask," in new and "if mask is None else" not in new  # None where no mask is given
    assert "attn_mask=bias.unsqueeze(0) if mask is None else bias.unsqueeze(0) + mask" in rewrite(OPTIONAL)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_always_masked_through_views_of_their_own(training):
    new = rewrite(ALWAYS)
    assert new.count("scaled_dot_product_attention(") == 1
    assert "view(" not in new.partition("nW = ")[2]  # the views go with the scores
    _same(ALWAYS, new, _mask(), training)


NOT_A_ROUND_TRIP = {
    # the merge keeps another axis than the split: not the scores' own layout
    "the views split and merge other axes": ('attn.view(B_ // nW, nW, self.num_heads, N, N)',
                                             'attn.view(-1, N, self.num_heads, N)'),
    # the split's leading size is inferred: the mask's broadcast over it has no size to name
    "the split's leading size inferred": ('attn.view(-1, nW, self.num_heads, N, N)',
                                          'attn.view(-1, self.num_heads, N, N)'),
    # the split splits the heads, not the leading axis
    "the split keeps the leading axis": ('attn.view(B_, self.num_heads // 2, 2, N, N)',
                                         'attn.view(-1, self.num_heads, N, N)'),
}


@pytest.mark.parametrize("split, merge", NOT_A_ROUND_TRIP.values(), ids=NOT_A_ROUND_TRIP.keys())
def test_views_that_are_no_leading_split_are_not_folded(split, merge):
    source = OPTIONAL.replace("attn.view(B_ // nW, nW, self.num_heads, N, N)", split) \
        .replace("attn.view(-1, self.num_heads, N, N)", merge)
    found, new = statuses(source)
    assert all(status != "rewritten" for status, _ in found), found
    assert ".flatten(0, 1)" not in new
    if new != source:  # the unmasked branch alone: the original stays where the mask is given
        assert "softmax" in new and "if mask is not None" in new


def test_the_mask_read_after_its_branch_keeps_a_branch():
    # the tested variable is read again after the merge: assigning it the folded mask would change that read
    source = OPTIONAL.replace(TAIL, '''
        attn = self.attn_drop(attn)
        out = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return out if mask is None else out * mask.shape[0]
''')
    found, new = statuses(source)
    assert all(status != "rewritten" for status, _ in found), found
    assert "flatten(0, 1)" not in new
