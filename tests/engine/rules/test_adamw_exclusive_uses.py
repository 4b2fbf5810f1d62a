"""Fused AdamW where the parameter list also goes elsewhere, but never on the optimizer's path
(OpenNMT's `build_torch_optimizer`: the same `params` go to its own AdaFactor in another `elif` of
the chain choosing the optimizer), and over a list filled by `append` in a loop over
`model.named_parameters()` (OpenNMT's dense parameters beside SparseAdam's). Each rewrite is run
against the original for a few steps in float64 on a tiny nn.Linear; uses that can run with the
optimizer's call, and lists whose items are not parameters, must not be rewritten."""

from __future__ import annotations

import textwrap
from functools import cache

import pytest

from engine.scan import scan_source, select_rules
from tests.engine.rules.harness import namespace, train_steps

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

_rules = cache(select_rules)

CHAIN = textwrap.dedent("""
    import torch
    from torch import optim


    class Factored:
        def __init__(self, params):
            self.params = params
            params.clear()  # may change the list it is given


    def build(model, kind):
        params = [p for p in model.parameters() if p.requires_grad]
        if kind == "sgd":
            optimizer = optim.SGD(params, lr=0.1)
        elif kind == "factored":
            optimizer = Factored(params)
        elif kind == "adam":
            optimizer = optim.Adam(params, lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
        else:
            raise ValueError(kind)
        return optimizer
""")

DENSE = textwrap.dedent("""
    import torch
    from torch import optim


    def build(model, kind):
        dense = []
        sparse = []
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            if "embed" in name:
                sparse.append(param)
            else:
                dense.append(param)
        return optim.Adam(dense, lr=1e-2, betas=(0.9, 0.98), eps=1e-8)
""")


def _rewrite(code: str) -> tuple[list, str]:
    findings, new = scan_source(code, _rules("fused-adamw"), path="example.py", module="example")
    return [f for f in findings if f.rule_id == "fused-adamw"], new


def _trained(code: str, kind: str):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).double()
    opt = namespace(code)["build"](model, kind)
    train_steps(model, opt, 4)
    return model, opt


@pytest.mark.parametrize("code", [CHAIN, DENSE], ids=["elif chain", "appended in a loop"])
def test_the_optimizer_steps_the_same_with_fused(code: str):
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], [(f.status, f.reason) for f in findings]
    assert "fused=all(" in "".join(new.split()), new
    model_a, opt_a = _trained(code, "adam")
    model_b, opt_b = _trained(new, "adam")
    assert all(g["fused"] is None for g in opt_a.param_groups)
    assert all(g["fused"] is True for g in opt_b.param_groups)  # the CPU has a fused kernel
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("code", "old", "new"),
    [
        # a separate `if`: both can run in one call
        (CHAIN, '    elif kind == "adam":', '    if kind == "adam":'),
        # the use comes first on the optimizer's own path
        (CHAIN, '        optimizer = optim.Adam(', '        Factored(params)\n        optimizer = optim.Adam('),
        # the chain in a loop: one pass takes one branch, the next the other
        (CHAIN, "    params = [p for p in model.parameters() if p.requires_grad]\n",
         "    params = [p for p in model.parameters() if p.requires_grad]\n    for _ in range(2):\n"),
        # (name, tensor) pairs, which optimizers take too: not tensors whose device can be read
        (DENSE, "dense.append(param)", "dense.append((name, param))"),
        # the list goes elsewhere too
        (DENSE, "    return optim.Adam(", "    Factored(dense)\n    return optim.Adam("),
    ],
    ids=["separate if", "used before", "in a loop", "named pairs", "passed elsewhere"],
)
def test_uses_that_can_run_with_the_optimizer_are_near_misses(code: str, old: str, new: str):
    assert old in code
    if "range(2)" in new:  # indent the chain under the loop
        head, _, tail = code.partition(old)
        body, _, rest = tail.partition("    return optimizer\n")
        code = head + new + textwrap.indent(body, "    ") + "    return optimizer\n" + rest
    else:
        code = code.replace(old, new)
    compile(code, "example.py", "exec")
    findings, rewritten = _rewrite(code)
    assert findings and all(f.status == "near-miss" for f in findings), [(f.status, f.reason) for f in findings]
    assert rewritten == code
