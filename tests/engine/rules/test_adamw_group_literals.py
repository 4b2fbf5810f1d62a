"""Fused AdamW over parameter groups written as dict literals whose `params` are generators
(vocos' `configure_optimizers`: `[{"params": self.mpd.parameters()}, ...]`). The device test cannot
read a generator without consuming it, so each such value is made a list where it is written (the
optimizer makes it a list anyway) and the test reads the groups directly; the rewrite must really
fuse (checked on the CPU) and step as the original does. Where the literal cannot be proven to be
read by the optimizer alone, with nothing in between that could change what the generators give,
the call is a near-miss saying `fused` would never be set."""

from __future__ import annotations

import textwrap

import pytest

from tests.engine.rules.harness import namespace as _load
from tests.engine.rules.harness import scan, train_steps

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def _rewrite(code: str) -> tuple[list, str]:
    findings, new = scan(code, "fused-adamw")
    return [f for f in findings if f.rule_id == "fused-adamw"], new


VOCOS = textwrap.dedent("""
    import torch


    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.disc_a = torch.nn.Linear(3, 3)
            self.disc_b = torch.nn.Linear(3, 1)
            self.backbone = torch.nn.Linear(3, 3)
            self.head = torch.nn.Linear(3, 3)
            self.head.bias.requires_grad_(False)

        def forward(self, x):
            return self.disc_b(self.disc_a(self.head(self.backbone(x))))

        def configure_optimizers(self):
            disc_params = [
                {"params": self.disc_a.parameters()},
                {"params": self.disc_b.parameters(), "lr": 1e-3},
            ]
            gen_params = [
                {"params": filter(lambda p: p.requires_grad, self.backbone.parameters())},
                {"params": (p for p in self.head.parameters() if p.requires_grad), "weight_decay": 0.0},
            ]
            opt_disc = torch.optim.AdamW(disc_params, lr=1e-2, betas=(0.8, 0.9))
            opt_gen = torch.optim.AdamW(gen_params, lr=1e-2, betas=(0.8, 0.9))
            return opt_disc, opt_gen
""")


def test_generator_groups_are_made_lists_where_written():
    findings, new = _rewrite(VOCOS)
    assert [f.status for f in findings] == ["rewritten", "rewritten"], findings
    assert '{"params": list(self.disc_a.parameters())}' in new
    assert '{"params": list(filter(lambda p: p.requires_grad, self.backbone.parameters()))}' in new
    assert '"params": list(p for p in self.head.parameters() if p.requires_grad)' in new
    assert 'fused=all(p.device.type in ("cpu", "cuda") for g in disc_params for p in g["params"])' in new
    assert 'fused=all(p.device.type in ("cpu", "cuda") for g in gen_params for p in g["params"])' in new
    assert "isinstance" not in new and ":=" not in new


def _steps(code: str, steps: int = 4):
    model = _load(code)["Model"]().double()
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    opts = model.configure_optimizers()
    for opt in opts:
        train_steps(model, opt, steps)
    return model, opts


def test_generator_groups_step_the_same_and_fuse():
    _, new = _rewrite(VOCOS)
    model_a, opts_a = _steps(VOCOS)
    model_b, opts_b = _steps(new)
    for opt_a, opt_b in zip(opts_a, opts_b, strict=True):
        assert all(g["fused"] is None for g in opt_a.param_groups)
        assert all(g["fused"] is True for g in opt_b.param_groups)  # all on the CPU, which has a fused kernel
        assert [len(g["params"]) for g in opt_b.param_groups] == [len(g["params"]) for g in opt_a.param_groups]
        assert [g["lr"] for g in opt_b.param_groups] == [g["lr"] for g in opt_a.param_groups]
    assert [len(g["params"]) for g in opts_b[1].param_groups] == [2, 1]  # the frozen bias is left out
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


_GEN = "        gen_params = [\n"
_CALL = "        opt_disc = torch.optim.AdamW(disc_params, lr=1e-2, betas=(0.8, 0.9))\n"


@pytest.mark.parametrize(
    "before",
    [
        # something between the literal and the optimizer may change what the generators give
        "        self.disc_b.extra = torch.nn.Linear(1, 1)\n",
        "        self.disc_a.weight.requires_grad_(False)\n",
        # the list is read elsewhere: made lists earlier, it could be seen changed
        "        print(len(disc_params))\n",
    ],
)
def test_generator_groups_not_proven_read_by_the_optimizer_alone_are_near_misses(before: str):
    code = VOCOS.replace(_GEN, before + _GEN)
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["near-miss", "rewritten"], findings
    assert "`fused` would never be set" in findings[0].reason
    assert "list(self.disc_a.parameters())" not in new


def test_generator_groups_under_another_block_are_near_misses():
    code = VOCOS.replace(_CALL, "        if self.training:\n    " + _CALL)
    findings, new = _rewrite(code)
    assert findings[0].status == "near-miss", findings
    assert "`fused` would never be set" in findings[0].reason


def test_groups_from_elsewhere_keep_the_run_time_test():
    """Groups a helper makes are not literals here: their `params` may be lists, read at run time."""
    code = VOCOS.replace('''        disc_params = [
            {"params": self.disc_a.parameters()},
            {"params": self.disc_b.parameters(), "lr": 1e-3},
        ]
''', "        disc_params = self.disc_groups()\n")
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten", "rewritten"], findings
    assert "disc_params := list(disc_params)" in new
    assert 'isinstance(g.get("params"), list)' in new


def test_list_groups_of_other_tensors_are_not_read_as_literals():
    """`list(extra)` may hold one tensor twice (updated twice by the default implementation, once
    by the fused kernel): such groups are not taken as proven literals."""
    code = VOCOS.replace('{"params": self.disc_a.parameters()}', '{"params": list(self.extra)}')
    findings, new = _rewrite(code)
    assert 'for g in disc_params for p in g["params"]' not in new
    code = VOCOS.replace('{"params": self.disc_a.parameters()}', '{"params": list(self.disc_a.parameters())}')
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten", "rewritten"], findings
    assert 'fused=all(p.device.type in ("cpu", "cuda") for g in disc_params for p in g["params"])' in new
    assert "list(list(" not in new
