"""The tanh GELU read by algebra, and fused AdamW over parameters selected from `.parameters()`:
each source is scanned, rewritten, and both sides run in float64 — the GELU on values, edge cases
and gradients, the optimizer for several steps (parameters, groups, a one-shot generator input).
Look-alikes must not be rewritten."""

from __future__ import annotations

import math
import textwrap
from functools import cache

import pytest

from engine.match.polynomial import PolynomialReader
from engine.scan import scan_source, select_rules

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


_rules = cache(select_rules)


def _rewrite(code: str, rule: str) -> tuple[list, str]:
    code = textwrap.dedent(code)
    findings, new = scan_source(code, _rules(rule), path="example.py", module="example")
    return [f for f in findings if f.rule_id == rule], new


def _load(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, "example.py", "exec"), namespace)  # noqa: S102 - the test's own source
    return namespace


GELUS = {
    "factored": """
        import torch

        def act(x):
            return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))
        """,
    "cached on the function": """
        import math
        import torch

        def act(x):
            if not hasattr(act, "_a"):
                act._a = math.sqrt(2 / math.pi)
            return 0.5 * x * (1 + torch.tanh(act._a * (x + 0.044715 * torch.pow(x, 3))))
        """,
    "divided, half last, in a statement of its own": """
        import math
        import torch

        def act(x):
            inner = x + x ** 3 * 0.044715
            return x * (1 + torch.tanh(inner / math.sqrt(math.pi / 2))) * 0.5
        """,
    "cdf term, distributed": """
        import numpy as np
        import torch

        def act(x):
            cdf = 0.5 * (1.0 + torch.tanh(np.sqrt(2 / np.pi) * x + np.sqrt(2 / np.pi) * 0.044715 * x.pow(3)))
            return x * cdf
        """,
}


@pytest.mark.parametrize("name", list(GELUS))
def test_tanh_gelu_spellings_compute_the_same(name: str):
    findings, new = _rewrite(GELUS[name], "gelu-tanh")
    assert [f.status for f in findings] == ["rewritten"], findings
    assert "tanh(" not in new and 'approximate="tanh"' in new
    original, rewritten = _load(textwrap.dedent(GELUS[name]))["act"], _load(new)["act"]
    torch.manual_seed(0)
    x = torch.cat([torch.randn(64, dtype=torch.float64) * 4, torch.tensor([0.0, -0.0, 1e-8, -30.0, 30.0, 1e4],
                                                                         dtype=torch.float64)])
    for shape in [(70,), (70, 1), (1, 70)]:  # size-1 axes
        a = x.reshape(shape).clone().requires_grad_(True)
        b = x.reshape(shape).clone().requires_grad_(True)
        ya, yb = original(a), rewritten(b)
        torch.testing.assert_close(yb, ya, rtol=1e-9, atol=1e-12)
        ya.sum().backward()
        yb.sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12)


LOOK_ALIKES = {
    "0.0447": "0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.0447 * x * x)))",
    "0.7": "0.5 * x * (1.0 + torch.tanh(0.7 * (x + 0.044715 * x ** 3)))",
    "sqrt(2/pi) to 1e-4 only": "0.5 * x * (1.0 + torch.tanh(0.79796 * (x + 0.044715 * x ** 3)))",
    "no 0.5": "x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))",
    "sigmoid": "x * torch.sigmoid(1.702 * x)",
    "an extra square term": "0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3 + 0.01 * x * x)))",
    "another tensor inside": "0.5 * x * (1.0 + torch.tanh(0.7978845608 * (y + 0.044715 * x ** 3)))",
    "cube of another tensor": "0.5 * x * (1.0 + torch.tanh(0.7978845608 * (x + 0.044715 * y ** 3)))",
}


@pytest.mark.parametrize("name", list(LOOK_ALIKES))
def test_tanh_gelu_look_alikes_are_not_rewritten(name: str):
    code = f"import torch\n\n\ndef act(x, y):\n    return {LOOK_ALIKES[name]}\n"
    findings, new = _rewrite(code, "gelu-tanh")
    assert all(f.status == "near-miss" for f in findings), findings
    assert new == code


def test_function_attribute_written_elsewhere_is_not_a_constant():
    code = textwrap.dedent("""
        import math
        import torch

        def act(x):
            if not hasattr(act, "_a"):
                act._a = math.sqrt(2 / math.pi)
            return 0.5 * x * (1 + torch.tanh(act._a * (x + 0.044715 * torch.pow(x, 3))))

        def tune(value):
            setattr(act, "_a", value)
        """)
    findings, new = _rewrite(code, "gelu-tanh")
    assert [f.status for f in findings] == ["near-miss"]
    assert new == code


def test_polynomial_reader_multiplies_out_and_factors():
    from engine.extract import extract_source
    from engine.match.matcher import MethodIndex

    code = "import torch\n\n\ndef f(x):\n    return torch.tanh((x - 2 * x * (x * 0.5)) * (1 + x) / 4)\n"
    fm = extract_source(code, "example.py", "example")
    cls = fm.classes[0]
    method = cls.methods[0]
    ix = MethodIndex(fm, cls, method)
    tanh = next(n for n in method.nodes if n.op == "tanh")
    reader = PolynomialReader(ix, "x", tanh)
    poly = reader.read(tanh.inputs[0])
    # (x - x^2) (1 + x) / 4 = (x - x^3) / 4
    assert poly is not None and set(poly) == {1, 3}
    assert math.isclose(poly[1], 0.25) and math.isclose(poly[3], -0.25)


# ----------------------------------------------------------------------------------------------
# fused-adamw over a selection of a module's parameters

ADAM = """
import torch
from torch import optim


class Agent:
    def __init__(self, model, lr, shared=None):
        self.model = model
        if shared is None:
            self.optimizer = optim.{cls}(
                {params},
                lr,
            )
"""

SELECTIONS = {
    "filter": "filter(lambda p: p.requires_grad, self.model.parameters())",
    "generator": "(p for p in self.model.parameters() if p.requires_grad)",
    "list": "[p for p in self.model.parameters() if p.requires_grad]",
}


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1)).double()
    model[1].weight.requires_grad_(False)  # a frozen parameter the selection leaves out
    return model


def _train(agent_cls, steps=4):
    model = _model()
    agent = agent_cls(model, 1e-2)
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 3, dtype=torch.float64)
        agent.optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        agent.optimizer.step()
    return model, agent.optimizer


@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
@pytest.mark.parametrize("name", list(SELECTIONS))
def test_selected_parameters_step_the_same(cls: str, name: str):
    code = ADAM.format(cls=cls, params=SELECTIONS[name])
    findings, new = _rewrite(code, "fused-adamw")
    assert [f.status for f in findings] == ["rewritten"], findings
    assert 'fused=all(p.device.type in ("cpu", "cuda") for p in self.model.parameters())' in " ".join(new.split()) \
        .replace("( ", "(").replace(" )", ")")
    original, rewritten = _load(code)["Agent"], _load(new)["Agent"]
    model_a, opt_a = _train(original)
    model_b, opt_b = _train(rewritten)
    assert opt_b.param_groups[0]["fused"] is True  # all on the CPU, which has a fused kernel
    assert len(opt_b.param_groups[0]["params"]) == len(opt_a.param_groups[0]["params"]) == 5  # the generator is read once
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
    assert torch.equal(model_b[1].weight, torch.ones(4, dtype=torch.float64))  # the frozen one untouched


def test_a_parameter_elsewhere_keeps_the_default():
    """The devices are read from every parameter of the module: one on a device without a fused
    kernel (a meta tensor here) makes `fused=False`, never a fused step there."""
    code = ADAM.format(cls="Adam", params=SELECTIONS["filter"])
    _, new = _rewrite(code, "fused-adamw")
    model = _model()
    model.register_parameter("elsewhere", torch.nn.Parameter(torch.empty(2, device="meta"), requires_grad=False))
    agent = _load(new)["Agent"](model, 1e-2)
    assert agent.optimizer.param_groups[0]["fused"] is False


@pytest.mark.parametrize("params", [
    "filter(lambda p: p.requires_grad, params)",  # passed in: maybe a one-shot generator
    "(p.detach() for p in self.model.parameters())",  # not the module's tensors
    "(q for p in self.model.parameters() for q in [p])",
])
def test_other_selections_are_materialized_once(params: str):
    """Not a selection of the module's own tensors, or one over parameters passed in (maybe a one-shot
    generator): the expression is read once into a list under a name `__init__` does not use, which
    the optimizer and the device test both read."""
    code = ADAM.format(cls="Adam", params=params).replace("def __init__(self, model, lr, shared=None)",
                                                          "def __init__(self, model, lr, params=None, shared=None)")
    findings, new = _rewrite(code, "fused-adamw")
    assert [f.status for f in findings] == ["rewritten"], findings
    assert f"param_groups := list({params[1:-1] if params.startswith('(') else params})" in new
    original, rewritten = _load(code)["Agent"], _load(new)["Agent"]
    a_model, b_model = _model(), _model()
    a = original(a_model, 1e-2, params=a_model.parameters())  # a one-shot generator
    b = rewritten(b_model, 1e-2, params=b_model.parameters())
    assert [len(g["params"]) for g in b.optimizer.param_groups] == [len(g["params"]) for g in a.optimizer.param_groups]
    assert b.optimizer.param_groups[0]["fused"] is True
    torch.manual_seed(1)
    for _ in range(4):
        x = torch.randn(5, 3, dtype=torch.float64)
        for model, agent in ((a_model, a), (b_model, b)):
            agent.optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            agent.optimizer.step()
    for x, y in zip(a_model.parameters(), b_model.parameters(), strict=True):
        torch.testing.assert_close(y, x, rtol=1e-12, atol=1e-14)


def test_a_selection_read_again_after_the_optimizer_is_not_rewritten():
    """A one-shot generator the function reads after the optimizer: materializing it would give that
    read the list where the original sees it spent."""
    code = ADAM.format(cls="Adam", params="params").replace(
        "def __init__(self, model, lr, shared=None)", "def __init__(self, model, lr, params=None, shared=None)")
    code += "        self.rest = list(params)\n"
    findings, new = _rewrite(code, "fused-adamw")
    assert [f.status for f in findings] == ["near-miss"] and "read elsewhere" in findings[0].reason, findings
    assert new == code
