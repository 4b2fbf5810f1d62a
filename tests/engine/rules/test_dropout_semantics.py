"""The attention rewrite drops exactly when the original drops, in eval and in train mode, for every
dropout spelling: a dropout module (drops in training mode), `F.dropout(x, p)` (its `training`
defaults to True: it drops in eval mode too), `F.dropout(x, p, training=self.training)`,
`training=False` (never drops), and the `nn.functional` / `torch.dropout` aliases.

Dropout draws differ between the eager op and the kernel, so equality of values is only asserted
where neither side drops; where they drop, both must drop (two seeds give two results) and agree
in expectation (the mean over many draws approaches the dropout-free output)."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SOURCE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)

    def forward(self, q, k, v):
        s = q @ k.transpose(-2, -1)
        p = s.softmax(dim=-1)
        p = {dropout}
        return p @ v
'''

# spelling -> (drops in eval mode, drops in train mode)
FORMS = {
    "self.drop(p)": (False, True),
    "F.dropout(p, 0.5)": (True, True),
    "F.dropout(p, p=0.5)": (True, True),
    "nn.functional.dropout(p, 0.5)": (True, True),
    "F.dropout(p, 0.5, training=self.training)": (False, True),
    "F.dropout(p, 0.5, self.training)": (False, True),
    "F.dropout(p, 0.5, training=False)": (False, False),
    "F.dropout(p, 0.5, training=True)": (True, True),
    "torch.dropout(p, 0.5, self.training)": (False, True),
}


def _module(source: str):
    namespace: dict = {}
    exec(compile(source, "<case>", "exec"), namespace)  # noqa: S102 - sources written in this file
    return namespace["Attention"]()


def _inputs():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(2, 2, 6, 8, generator=gen, dtype=torch.float64) for _ in range(3)]


def _drops(module, train: bool) -> bool:
    module.train(train)
    q, k, v = _inputs()
    torch.manual_seed(1)
    first = module(q, k, v)
    torch.manual_seed(2)
    return not torch.equal(first, module(q, k, v))


@pytest.mark.parametrize("form", list(FORMS))
def test_rewrite_drops_exactly_when_the_original_drops(form):
    source = SOURCE.format(dropout=form)
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    assert new != source, [(f.status, f.reason) for f in findings]
    original, rewritten = _module(source), _module(new)
    for train, expected in zip((False, True), FORMS[form], strict=True):
        assert _drops(original, train) == expected, "the table above is wrong about the original"
        assert _drops(rewritten, train) == expected, f"train={train}: the rewrite drops differently\n{new}"
        if not expected:
            original.train(train)
            rewritten.train(train)
            torch.testing.assert_close(rewritten(*_inputs()), original(*_inputs()))


def test_dropping_rewrite_agrees_in_expectation():
    """Where both drop, they drop the same thing: the means over many draws agree."""
    source = SOURCE.format(dropout="F.dropout(p, 0.5)")
    _, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    q, k, v = _inputs()
    q, k, v = (t.expand(4000, *t.shape[1:]).contiguous() for t in (q[:1], k[:1], v[:1]))
    means = []
    for text in (source, new):
        module = _module(text).eval()
        torch.manual_seed(3)
        means.append(module(q, k, v).mean(0))
    clean = torch.softmax(q[:1] @ k[:1].transpose(-2, -1), -1) @ v[:1]
    for mean in means:
        assert (mean - clean[0]).abs().max() < 0.15
    assert (means[0] - means[1]).abs().max() < 0.2
