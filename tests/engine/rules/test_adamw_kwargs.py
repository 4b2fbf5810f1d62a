"""Fused Adam/AdamW where the call forwards `**kwargs` (stanza's `dispatch_optimizer(name, parameters,
..., **extra_args)`): `fused=` is added only where the keys the dict can hold are proven, from the
function's code and from every call of it in the package, to include no setting that chooses an
implementation. The parameters, passed in as groups whose `params` may be generators, are
materialized once; a group's `params` are read for the device test only where they are a list.
Each rewrite is run against the original in float64."""

from __future__ import annotations

import textwrap

import pytest

from engine.scan import scan_path
from tests.engine.rules.harness import namespace, statuses, train_steps

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

DISPATCH = textwrap.dedent("""
    import torch


    def dispatch_optimizer(name, parameters, lr=None, betas=None, **extra_args):
        extra_logging = ", ".join("%s=%s" % (x, y) for x, y in extra_args.items())
        if name == "adam":
            return torch.optim.Adam(parameters, lr=lr, betas=betas, **extra_args)
        elif name == "adamw":
            return torch.optim.AdamW(parameters, lr=lr, betas=betas, **extra_args)
        elif name == "sgd":
            return torch.optim.SGD(parameters, lr=lr, **extra_args)
        raise ValueError(extra_logging)


    def get_optimizer(name, model, lr, weight_decay=None, generator=False):
        first, *rest = list(model.children())
        rest = [p for m in rest for p in m.parameters()]
        parameters = [{"params": list(first.parameters()) if not generator else first.parameters()}]
        parameters.append({"params": rest, "lr": lr * 0.5})
        extra_args = {}
        if weight_decay is not None:
            extra_args["weight_decay"] = weight_decay
        return dispatch_optimizer(name, parameters, lr=lr, betas=(0.9, 0.99), **extra_args)


    def get_split_optimizer(name, model, lr, weight_decay=None):
        extra_args = dict(weight_decay=weight_decay) if weight_decay else {}
        extra_args.update(maximize=False)
        return dispatch_optimizer(name, model.parameters(), lr=lr, **extra_args)
""")


def _steps(source: str, name: str, generator: bool = False, steps: int = 3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    opt = namespace(source)["get_optimizer"](name, model, 1e-2, weight_decay=0.01, generator=generator)
    train_steps(model, opt, steps)
    return model, opt


@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_kwargs_its_callers_fill_with_other_settings_get_fused(name: str, generator: bool):
    found, new = statuses(DISPATCH, "fused-adamw")
    assert [s for s, _ in found] == ["rewritten", "rewritten"], found
    assert "parameters := list(parameters)" in new and "**extra_args,\n" in new
    model_a, opt_a = _steps(DISPATCH, name, generator)
    model_b, opt_b = _steps(new, name, generator)
    # a group whose params are a generator is not read: fused stays at its default (None)
    assert [g["fused"] for g in opt_b.param_groups] == [None if generator else True] * 2
    assert [len(g["params"]) for g in opt_b.param_groups] == [len(g["params"]) for g in opt_a.param_groups] == [2, 2]
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("old", "new", "reason"),
    [
        # a caller passes foreach= through the dict, or directly
        ('extra_args["weight_decay"] = weight_decay', 'extra_args["foreach"] = False', "may set foreach= (at case.py:"),
        ("extra_args.update(maximize=False)", "extra_args.update(maximize=False, capturable=True)",
         "may set capturable="),
        ("betas=(0.9, 0.99), **extra_args)", "betas=(0.9, 0.99), fused=True, **extra_args)", "may set fused="),
        # the parameters are read on the optimizer's path too (not only on other branches)
        ("    if name == \"adam\":\n", "    extra_logging += str(len(list(parameters)))\n    if name == \"adam\":\n",
         "`parameters` is read elsewhere"),
    ],
)
def test_kwargs_that_may_choose_an_implementation_are_not_rewritten(old: str, new: str, reason: str):
    assert old in DISPATCH
    code = DISPATCH.replace(old, new)
    found, rewritten = statuses(code, "fused-adamw")
    assert len(found) == 2 and all(s == "near-miss" and reason in (r or "") for s, r in found), found
    assert rewritten == code


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # keys that are not constants, dicts from elsewhere
        ('extra_args["weight_decay"] = weight_decay', "extra_args[name] = weight_decay"),
        ("extra_args = {}\n", "extra_args = make_args()\n"),
        ("def get_split_optimizer(name, model, lr, weight_decay=None):\n"
         "    extra_args = dict(weight_decay=weight_decay) if weight_decay else {}\n",
         "def get_split_optimizer(name, model, lr, weight_decay=None, extra_args=None):\n"),
        ("extra_args.update(maximize=False)", "fill(extra_args)"),
        # the function is handed out, not only called
        ("raise ValueError(extra_logging)\n", "raise ValueError(extra_logging)\n\n\nOPTIMIZERS = [dispatch_optimizer]\n"),
        # nothing calls it
        ("def get_optimizer(", "def _unused(\n"),
    ],
)
def test_kwargs_whose_keys_are_not_known_decide_at_run_time(old: str, new: str):
    """Keys that cannot be proven: `fused=` goes into a dict merged under them, so that they win."""
    assert old in DISPATCH
    code = DISPATCH.replace(old, new)
    if new.startswith("def _unused"):
        code = code[: code.index("def _unused")]
    found, rewritten = statuses(code, "fused-adamw")
    assert [s for s, _ in found] == ["rewritten", "rewritten"], found
    assert rewritten.count('**{\n                "fused": {"foreach", "capturable", "differentiable"}.isdisjoint(') == 2
    assert rewritten.count("**extra_args,\n            },") == 2


MERGED = textwrap.dedent("""
    import torch


    def make_optimizer(name, model, lr, **extra):
        if name == "adam":
            return torch.optim.Adam(model.parameters(), lr=lr, **extra)
        return torch.optim.AdamW(model.parameters(), lr=lr, **extra)
""")


@pytest.mark.parametrize("name", ["adam", "adamw"])
@pytest.mark.parametrize(
    ("extra", "fused"),
    [
        ({}, True),
        ({"weight_decay": 0.01, "amsgrad": True}, True),
        # the caller's choice wins, and no other implementation is set beside it
        ({"fused": False}, False),
        ({"foreach": True}, None),
        ({"foreach": False}, None),
        ({"capturable": False}, None),
        ({"differentiable": False}, None),
    ],
)
def test_a_merged_setting_leaves_the_callers_choice(name: str, extra: dict, fused: bool | None):
    found, new = statuses(MERGED, "fused-adamw")
    assert [s for s, _ in found] == ["rewritten", "rewritten"], found
    models, optimizers = [], []
    for source in (MERGED, new):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
        opt = namespace(source)["make_optimizer"](name, model, 1e-2, **extra)
        train_steps(model, opt, 3)
        models.append(model)
        optimizers.append(opt)
    original, rewritten = optimizers
    assert rewritten.defaults["fused"] is fused
    assert original.defaults["foreach"] == rewritten.defaults["foreach"]
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


def test_a_method_forwarding_kwargs_merges_them():
    code = textwrap.dedent("""
        import torch


        class Trainer:
            def build(self, model, **extra):
                return torch.optim.AdamW(model.parameters(), lr=1e-3, **extra)

            def run(self, model):
                return self.build(model, weight_decay=0.1)
    """)
    found, new = statuses(code, "fused-adamw")
    assert [s for s, _ in found] == ["rewritten"], found
    assert ".isdisjoint(" in new and "extra.keys()" in new and "**extra,\n" in new


CALLER = textwrap.dedent("""
    from .common.utils import dispatch_optimizer as dispatch
    from .common import utils


    def train(model, cfg):
        args = {"weight_decay": 0.1}
        args.setdefault("amsgrad", True)
        first = dispatch("adam", model.parameters(), lr=1e-3, **args)
        return first, utils.dispatch_optimizer("adamw", model.parameters(), lr=1e-3, KEYWORD)
""")


@pytest.mark.parametrize(("keyword", "fires"), [("eps=1e-6", True), ("foreach=True", False), ("**cfg", True)])
def test_callers_in_other_files_of_the_package(tmp_path, keyword: str, fires: bool):
    """Calls through `from .common.utils import dispatch_optimizer as dispatch` and through the
    module (`utils.dispatch_optimizer(...)`), in another file of the package, are read too."""
    package = tmp_path / "pkg"
    (package / "common").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "common" / "__init__.py").write_text("")
    (package / "common" / "utils.py").write_text(DISPATCH[: DISPATCH.index("def get_optimizer")])
    (package / "train.py").write_text(CALLER.replace("KEYWORD", keyword))
    result = scan_path(tmp_path, rules="fused-adamw", rewrite=False)
    found = [(f.status, f.reason) for f in result.findings if f.rule_id == "fused-adamw"]
    if fires:
        assert [s for s, _ in found] == ["rewritten", "rewritten"], found
    else:
        assert len(found) == 2 and all(s == "near-miss" for s, _ in found), found
        assert all("may set foreach= (at pkg/train.py:10)" in r for _, r in found), found
