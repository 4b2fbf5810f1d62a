"""Masks of fairseq-style and Transformer-XL attention: a `masked_fill` value that is an attribute
set in `__init__` (speechbrain's RelPosMHAXL: `self.attn_fill_value = -65000` for half parameters,
`-float("inf")` otherwise).

The attribute holds one of the values `__init__` assigns it on its paths, where it assigns it on every
path and nothing else in the file writes it (engine.analysis.numbers.attribute_values). Each value
must drop the keys (-inf, the dtype's lowest, a huge negative number), and all must be infinite or
all finite: a row whose every key is masked is NaN under -inf and the average of v under a finite
fill, and the rewrite reproduces one of the two. Original against rewritten in float64, with fully
masked rows, eval and train; near-misses where the value is not proven."""

from __future__ import annotations

import pytest

from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

ATTRIBUTE_FILL = """
import torch
from torch import nn


class AttributeFill(nn.Module):
    def __init__(self, half=False, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        if half:
            self.fill = FINITE_HALF
        else:
            self.fill = OTHER

    def forward(self, q, k, v, mask):
        s = torch.matmul(q * 0.25, k.transpose(-2, -1))
        s = s.masked_fill(mask, self.fill)
        p = self.drop(torch.softmax(s, dim=-1))
        return torch.matmul(p, v)
"""


def _source(half: str, other: str) -> str:
    return ATTRIBUTE_FILL.replace("FINITE_HALF", half).replace("OTHER", other)


def _branches(init: str) -> str:
    """The module with `init` in place of the `if half:` / `else:` that sets the fill."""
    return ATTRIBUTE_FILL.replace(
        "if half:\n            self.fill = FINITE_HALF\n        else:\n            self.fill = OTHER", init
    )


def _rewrite(source: str):
    findings, new = scan_source(source, select_rules("sdpa-attention"), "case.py", "case")
    return [f for f in findings if f.rule_id == "sdpa-attention"], new


def _masks(b: int, h: int, n: int):
    """Key padding with a fully padded sample, and a query x key mask with one query whose every
    key is masked."""
    padding = torch.zeros(b, 1, 1, n, dtype=torch.bool)
    padding[0, ..., -2:] = True
    padding[1] = True  # every key of sample 1 masked
    rows = torch.rand(b, h, n, n) < 0.3
    rows[0, 0, 2] = True  # one query row with no key
    return {"padding": padding, "query x key": rows}


def _agree(source: str, new: str, infinite: bool):
    original, rewritten = {}, {}
    exec(compile(source, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    torch.manual_seed(0)
    b, h, n, d = 3, 2, 5, 4
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3))
    for mode in (False, True):  # dropout 0: training changes only the kernel's dropout_p
        a = original["AttributeFill"]().train(mode)
        c = rewritten["AttributeFill"]().train(mode)
        for name, mask in _masks(b, h, n).items():
            qa, qc = q.clone().requires_grad_(), q.clone().requires_grad_()
            out_a, out_c = a(qa, k, v, mask), c(qc, k, v, mask)
            torch.testing.assert_close(out_c, out_a, equal_nan=True, msg=lambda m, name=name: f"{name}: {m}")
            full = mask.expand(b, h, n, n).all(-1)
            assert full.any() and bool(out_a[full].isnan().all()) == infinite
            kept = ~full[..., None]
            (out_a * kept).nan_to_num().sum().backward()
            (out_c * kept).nan_to_num().sum().backward()
            if not infinite:
                torch.testing.assert_close(qc.grad, qa.grad)


@pytest.mark.parametrize(
    ("half", "other", "infinite"),
    [
        ("-1e4", "-1e9", False),
        ("-torch.finfo(torch.float16).max", "torch.finfo(torch.float32).min", False),
        ('float("-inf")', '-float("inf")', True),
    ],
)
def test_a_fill_attribute_set_on_every_path_is_its_values(half, other, infinite):
    source = _source(half, other)
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    assert "self.fill" not in new.split("def forward", 1)[1]
    assert ('float("nan")' in new or "float('nan')" in new) == infinite
    _agree(source, new, infinite)


def test_a_conditional_expression_gives_both_its_arms():
    source = _branches("self.fill = -1e4 if half else -1e9")
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    _agree(source, new, False)


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        # -inf on one path, a finite fill on the other: fully masked rows are NaN or the average of v
        (_source("-65000", '-float("inf")'), "-inf on some paths of `__init__` and finite on others"),
        # a value that does not drop the keys on one path
        (_source("-1.0", "-1e9"), "is not -inf"),
        (_branches("if half:\n            self.fill = -1e9"), "is not -inf"),  # not set on every path
        (_source("-1e9", "-1e9") + "\n    def to_half(self):\n        self.fill = -1.0\n", "is not -inf"),
        (
            _source("-1e9", "-1e9") + "\n\nclass Sub(AttributeFill):\n    def __init__(self):\n"
            "        super().__init__()\n        self.fill = 0.0\n",
            "is not -inf",
        ),  # a subclass resets it
        (
            _source("-1e9", "-1e9")
            + "\n\ndef make():\n    m = AttributeFill()\n    setattr(m, 'fill', 0.0)\n"
            "    return m\n",
            "is not -inf",
        ),
        (_branches("self.fill = -1e9\n        self.fill -= 1"), "is not -inf"),  # an augmented assignment
    ],
)
def test_a_fill_attribute_not_proven_is_a_near_miss(source, reason):
    findings, _ = _rewrite(source)
    assert [f.status for f in findings] == ["near-miss"]
    assert reason in findings[0].reason


def test_another_class_setting_its_own_attribute_of_that_name_is_no_write():
    source = (
        _source("-1e9", "-1e4") + "\n\nclass Other(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.fill = 0.0\n"
    )
    findings, new = _rewrite(source)
    assert [f.status for f in findings] == ["rewritten"]
    _agree(source, new, False)


REFILLED = """
import torch
from torch import nn


class Refilled(nn.Module):
    def __init__(self, half=False, dropout=0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        if half:
            self.fill = -65000
        else:
            self.fill = -float("inf")

    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(-2, -1)) * 0.25
        s = s.masked_fill(mask, self.fill)
        p = self.drop(torch.softmax(s, dim=-1))
        p = p.masked_fill(mask, 0.0)
        return torch.matmul(p, v)
"""


@pytest.mark.parametrize("half", [False, True])
def test_probabilities_refilled_with_zero_under_the_mask_make_fully_masked_rows_zero(half):
    """speechbrain's fix-up after the softmax: the rows whose every key is masked are 0 whether the
    fill was -inf (NaN rows) or finite (the average of v), so the fill may differ between paths."""
    findings, new = _rewrite(REFILLED)
    assert [f.status for f in findings] == ["rewritten"]
    assert ".masked_fill(mask.all(-1, keepdim=True), 0.0)" in new
    original, rewritten = {}, {}
    exec(compile(REFILLED, "<original>", "exec"), original)  # noqa: S102 - test code written in this file
    exec(compile(new, "<rewritten>", "exec"), rewritten)  # noqa: S102
    torch.manual_seed(0)
    b, h, n, d = 3, 2, 5, 4
    q, k, v = (torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3))
    for mode in (False, True):
        a = original["Refilled"](half).train(mode)
        c = rewritten["Refilled"](half).train(mode)
        for name, mask in _masks(b, h, n).items():
            qa, qc = q.clone().requires_grad_(), q.clone().requires_grad_()
            va, vc = v.clone().requires_grad_(), v.clone().requires_grad_()
            out_a, out_c = a(qa, k, va, mask), c(qc, k, vc, mask)
            full = mask.expand(b, h, n, n).all(-1)
            assert full.any() and not out_a.isnan().any() and (out_a[full] == 0).all()
            torch.testing.assert_close(out_c, out_a, msg=lambda m, name=name: f"{name}: {m}")
            weight = torch.randn(out_a.shape, dtype=torch.float64)
            (out_a * weight).sum().backward()
            (out_c * weight).sum().backward()
            torch.testing.assert_close(qc.grad, qa.grad)
            torch.testing.assert_close(vc.grad, va.grad)


def test_a_refill_with_another_value_is_a_near_miss():
    findings, _ = _rewrite(REFILLED.replace("p.masked_fill(mask, 0.0)", "p.masked_fill(mask, 1.0)"))
    assert [f.status for f in findings] == ["near-miss"]
    assert "constant differs" in findings[0].reason  # masked keys get weight 1: no fix-up


def test_a_refill_under_another_mask_is_no_rewrite():
    source = REFILLED.replace("p.masked_fill(mask, 0.0)", "p.masked_fill(other, 0.0)")
    findings, new = _rewrite(source.replace("v, mask)", "v, mask, other)"))
    assert all(f.status == "near-miss" for f in findings) and "scaled_dot_product_attention" not in new


def test_a_zero_fill_after_the_softmax_without_one_before_is_no_attention_mask():
    """Zeroing probabilities with no fill before the softmax is no renormalized softmax (flamingo's
    text without media): the refill statement refers to the mask of the fill before, and without
    that fill it matches nothing."""
    source = REFILLED.replace("        s = s.masked_fill(mask, self.fill)\n", "")
    findings, new = _rewrite(source)
    assert "scaled_dot_product_attention" not in new
    assert all(f.status == "near-miss" for f in findings)
