"""A module's state that its methods compute at run time (`self.query = self.embed(item)` in
`forward`) and read back in another is data: its reads are the operands of nodes (`.unsqueeze` of
`self.query`), not opaque text, and it is no number to scale by. Attributes only set from other
attributes and constants, or to an object built there, stay as they were."""

from __future__ import annotations

from engine.dsl.ir import Sym
from engine.extract import extract_source

SOURCE = '''
import torch
from torch import nn


class Memory(nn.Module):
    def __init__(self, n, dim):
        super().__init__()
        self.embed = nn.Embedding(n, dim)
        self.scale = dim ** -0.5
        self.steps = 0

    def forward(self, item, keys):
        self.query = self.embed(item)
        self.rows = []
        self.rows.append(self.embed(keys))
        self.steps += 1
        self.cache = Cache(item)
        return self._read(keys)

    def _read(self, keys):
        q = self.query.unsqueeze(2)
        r = self.rows[0].view(-1, 4, 4)
        s = keys * self.query
        t = keys * self.scale
        u = keys * self.steps
        return q, r, s, t, u, self.cache.read(keys)
'''


def _nodes():
    method = extract_source(SOURCE, "m.py", "m").cls("Memory").method("_read")
    return {o: n for n in method.nodes for o in n.outputs}


def test_state_computed_at_run_time_is_data():
    nodes = _nodes()
    assert nodes["q"].op == ".unsqueeze" and nodes["q"].inputs[0] == Sym("self.query")
    assert nodes["r"].op == ".view"  # of the item of a list the forward fills
    assert nodes["s"].op == "mul"  # a tensor, no factor to scale by


def test_settings_counters_and_objects_stay_as_they_were():
    nodes = _nodes()
    assert nodes["t"].op == "scale" and nodes["u"].op == "scale"
    assert not any(n.op == "getattr" for n in nodes.values())  # `self.cache.read` is no data read
