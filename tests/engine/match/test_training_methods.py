"""Which methods a scan reads: those that run in the training step. A public method that `forward`
calls runs there as much as a private helper does, and its code is rewritten where it is written
(not in the inlined copy at the caller, which would leave the method behind unused); a public
method nothing in the step calls (`generate`) is not read."""

from __future__ import annotations

import torch

from tests.engine.rules.harness import namespace, scan

SOURCE = '''
import math
import torch
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def gelu(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def forward(self, x):
        return self.proj(self.gelu(x))

    def generate(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
'''


def test_a_public_method_that_forward_calls_is_rewritten_in_place():
    findings, text = scan(SOURCE, "gelu-erf")
    assert [(f.status, f.method, f.line) for f in findings] == [("rewritten", "gelu", 13)]
    assert "def gelu(self, x):\n        return nn.functional.gelu(x)" in text
    # the method nothing in the training step calls keeps its code
    assert "def generate(self, x):\n        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))" in text
    old, new = namespace(SOURCE)["FeedForward"], namespace(text)["FeedForward"]
    torch.manual_seed(0)
    a = old(8)
    b = new(8)
    b.load_state_dict(a.state_dict())
    x = torch.randn(4, 8)
    torch.testing.assert_close(b(x), a(x))


TABLE = '''
import math
import torch
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, dim, act):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.act_fn = self.get_hidden_act(act)

    def get_hidden_act(self, act):
        table = {"gelu": self.gelu, "relu": torch.relu, "swish": self.swish}
        return table[act]

    def gelu(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def swish(self, x):
        return x * torch.sigmoid(x)

    def forward(self, x):
        return self.proj(self.act_fn(x))


class Stored(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.act = self.gelu

    def gelu(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def forward(self, x):
        return self.act(self.proj(x))


class Unused(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def gelu(self, x):
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    def forward(self, x):
        return self.proj(x)

    def generate(self, x):
        act = self.gelu
        return act(x)
'''


def test_a_method_handed_on_through_a_table_or_an_attribute_is_rewritten():
    """recbole's FeedForward: `self.intermediate_act_fn = self.get_hidden_act(name)` in `__init__`,
    whose table of bound methods holds `self.gelu`; and a bound method stored as the callable. A
    method only a public method outside the step names (`generate`) is not read."""
    findings, text = scan(TABLE, "gelu-erf")
    assert [(f.status, f.cls, f.method) for f in findings] == [
        ("rewritten", "FeedForward", "gelu"), ("rewritten", "Stored", "gelu")]
    assert text.count("return nn.functional.gelu(x)") == 2
    old, new = namespace(TABLE), namespace(text)
    x = torch.randn(4, 8, dtype=torch.float64)
    for name, args in (("FeedForward", (8, "gelu")), ("Stored", (8,))):
        torch.manual_seed(0)
        a = old[name](*args).double()
        b = new[name](*args).double()
        b.load_state_dict(a.state_dict())
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = a(xa), b(xb)
        torch.testing.assert_close(yb, ya)
        ya.sum().backward()
        yb.sum().backward()
        torch.testing.assert_close(xb.grad, xa.grad)


STACK = '''
import math
import torch
from torch import nn


class Stack(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, dim)

    def push(self, x):
        return self.proj(x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))))
'''


def test_the_public_methods_of_a_module_without_forward_are_read():
    # a module that the model holding it calls by its methods (stanza's TransformerTreeStack)
    findings, _ = scan(STACK, "gelu-erf")
    assert [(f.status, f.method) for f in findings] == [("rewritten", "push")]
    # with a forward of its own (or of a base class), a public method it does not call is not read
    with_forward = STACK + "\n    def forward(self, x):\n        return self.proj(x)\n"
    assert scan(with_forward, "gelu-erf")[0] == []
    inherited = STACK.replace("class Stack(nn.Module):", "class Stack(Base):").replace(
        "class Stack", "class Base(nn.Module):\n    def forward(self, x):\n        return x\n\n\nclass Stack", 1)
    assert all(f.method != "push" for f in scan(inherited, "gelu-erf")[0])
