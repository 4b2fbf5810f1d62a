"""A parameter-free module built in `__init__` (`self.attend = nn.Softmax(dim=-1)`) that the rewrite
orphaned in its class goes, with the comment heading it alone, even where other classes of the
file read their own attribute of the same name (labml's retro model: three attention classes, each
with its own `self.softmax`). A subclass or a base of the class, another receiver than `self`, or
the name as a string may read the same attribute: it stays."""

from __future__ import annotations

import pytest

from tests.engine.rules.harness import rewrite

SOURCE = '''
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 8 ** -0.5

        # Softmax for attention probabilities
        self.attend = nn.Softmax(dim=-1)

        self.out = nn.Identity()

    def forward(self, q, k, v):
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = self.attend(dots)
        return self.out(torch.matmul(attn, v))


class Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.attend = nn.Softmax(dim=-1)

    def forward(self, x):
        return (self.attend(x) * x).sum(-1)


class Built(nn.Module):
    def __init__(self):
        super().__init__()
        self.attend = nn.Softmax(dim=-1)
        self.size = 4
'''


def test_orphaned_in_its_class_goes_with_its_comment():
    new = rewrite(SOURCE)
    assert "scaled_dot_product_attention(" in new
    assert "        self.scale = 8 ** -0.5\n\n        self.out = nn.Identity()\n" in new
    assert "Softmax for attention" not in new
    # Pool's own stays, and Built's, which nothing read before the rewrite either (not its orphan)
    assert new.count("self.attend = nn.Softmax(dim=-1)") == 2
    assert "return (self.attend(x) * x).sum(-1)" in new


@pytest.mark.parametrize("extra", [
    "\n\nclass Sharp(Attention):\n    def temper(self, x):\n        return self.attend(x)\n",
    "\n\ndef probabilities(model, x):\n    return model.attend(x)\n",
    "\n\nNAMES = ['attend']\n",
], ids=["subclass", "other-receiver", "string"])
def test_read_elsewhere_it_stays(extra):
    new = rewrite(SOURCE + extra)
    assert "scaled_dot_product_attention(" in new
    assert new.count("self.attend = nn.Softmax(dim=-1)") == 3
