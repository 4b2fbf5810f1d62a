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
