"""Classes that are not modules (a Trainer, a sampler) are read as functions `Class.method`: the
optimizer a Trainer builds in its `__init__` is found, and nothing of theirs counts as a layer."""

from __future__ import annotations

from engine.extract import extract_source
from engine.scan import scan_source, select_rules

TRAINER = '''
import torch
from torch import nn
from torch.optim import Adam


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x)


class Trainer(object):
    def __init__(self, model, lr=1e-4):
        self.model = model
        self.opt = Adam(model.parameters(), lr=lr, betas=(0.9, 0.99))

    def step(self, batch):
        loss = self.model(batch).sum()
        loss.backward()
        self.opt.step()


class Config:
    hidden = 4
'''


def test_plain_class_methods_are_module_level_functions():
    fm = extract_source(TRAINER, "train.py", "train")
    by_name = {c.name: c for c in fm.classes}
    assert "Trainer" not in by_name and "Config" not in by_name  # not modules: no layers, no class model
    module_level = by_name["__module__"]
    names = [m.name for m in module_level.methods]
    assert names == ["Trainer.__init__", "Trainer.step"]  # Config has no method
    init = module_level.methods[0]
    assert any(n.op == "torch.optim.Adam" for n in init.nodes)


def test_optimizer_built_in_a_trainer_is_rewritten():
    findings, new_text = scan_source(TRAINER, select_rules("fused-adamw"), "train.py", "train")
    assert [(f.rule_id, f.status, f.line) for f in findings] == [("fused-adamw", "rewritten", 19)]
    changed = new_text[len(TRAINER.split("        self.opt = Adam(")[0]):]
    assert changed.startswith("        self.opt = Adam(") and "fused=" in changed.split("def step")[0]
