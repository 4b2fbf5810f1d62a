"""Fused AdamW over parameter groups grown in the function (demucs' `get_optimizer`: a list filled
by `append`/`insert`, groups from a helper whose `params` the function already iterated) and over
an optimizer a module builds in its `__init__` (ParlAI's TransresnetModel). Each rewrite is run
against the original for several steps in float64; look-alikes whose groups could be consumed by
reading their devices must not be rewritten."""

from __future__ import annotations

import contextlib
import textwrap
from functools import cache

import pytest

from engine.scan import scan_source, select_rules
from tests.engine.rules.harness import train_steps

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

_rules = cache(select_rules)


def _rewrite(code: str) -> tuple[list, str]:
    findings, new = scan_source(code, _rules("fused-adamw"), path="example.py", module="example")
    return [f for f in findings if f.rule_id == "fused-adamw"], new


def _load(code: str) -> dict:
    namespace: dict = {}
    exec(compile(code, "example.py", "exec"), namespace)  # noqa: S102 - the test's own source
    return namespace


GROUPS = textwrap.dedent("""
    import torch


    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(x)

        def make_optim_group(self):
            return {"params": PARAMS, "weight_decay": 0.1}


    def build():
        return torch.nn.Sequential(torch.nn.Linear(3, 3), Block(), torch.nn.Linear(3, 1)).double()


    def get_optimizer(model, kind):
        seen_params = set()
        other_params = []
        groups = []
        for n, module in model.named_modules():
            if hasattr(module, "make_optim_group"):
                group = module.make_optim_group()
                params = set(group["params"])
                assert params.isdisjoint(seen_params)
                seen_params |= set(params)
                groups.append(group)
        for param in model.parameters():
            if param not in seen_params:
                other_params.append(param)
        groups.insert(0, {"params": other_params})
        parameters = groups
        if kind == "adam":
            return torch.optim.Adam(parameters, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
        elif kind == "adamw":
            return torch.optim.AdamW(parameters, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.01)
        raise ValueError(kind)
""")


def _steps(namespace: dict, kind: str, steps: int = 4):
    model = namespace["build"]()
    torch.manual_seed(0)
    for p in model.parameters():
        torch.nn.init.normal_(p)
    opt = namespace["get_optimizer"](model, kind)
    train_steps(model, opt, steps)
    return model, opt


@pytest.mark.parametrize("helper_params", ["list(self.parameters())", "self.parameters()"])
@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_groups_grown_in_the_function_step_the_same(kind: str, helper_params: str):
    """A helper's group whose `params` is a one-shot generator: `set(...)` spends it before the
    optimizer reads it, in the original and the rewrite alike."""
    code = GROUPS.replace("PARAMS", helper_params)
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten", "rewritten"], findings
    assert "for g in parameters" in new
    model_a, opt_a = _steps(_load(code), kind)
    model_b, opt_b = _steps(_load(new), kind)
    assert all(g["fused"] is True for g in opt_b.param_groups)  # all on the CPU, which has a fused kernel
    assert [len(g["params"]) for g in opt_b.param_groups] == [len(g["params"]) for g in opt_a.param_groups]
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("line", "replacement"),
    [
        # the helper's `params` is not iterated first: a generator there would be spent by the device read
        ('params = set(group["params"])', "params = set()"),
        # ... or only on some paths
        ('params = set(group["params"])', 'params = set(group["params"]) if kind else set()'),
        # a loop over them may stop early: the device read would take what the optimizer gets
        ('params = set(group["params"])', 'params = set()\nfor p in group["params"]:\n    break'),
        # the group goes elsewhere too, which may change its params
        ("groups.append(group)", "groups.append(group)\nregister(group)"),
        # the list of groups goes to a function that may add anything
        ("parameters = groups", "parameters = groups\nregister(groups)"),
        # a group passed in
        ('groups.insert(0, {"params": other_params})', "groups.insert(0, kind)"),
        # a group whose params are a generator built here
        (
            'groups.insert(0, {"params": other_params})',
            'groups.insert(0, {"params": (p for p in other_params)})',
        ),
    ],
)
def test_groups_that_reading_could_consume_are_not_rewritten(line: str, replacement: str):
    code = GROUPS.replace("PARAMS", "self.parameters()")
    old = next(text for text in code.splitlines(keepends=True) if text.strip() == line)
    indent = old[: len(old) - len(old.lstrip())]
    code = code.replace(old, "".join(f"{indent}{part}\n" for part in replacement.split("\n")))
    findings, new = _rewrite(code)
    assert findings and all(f.status == "near-miss" for f in findings), findings
    assert new == code


AGENT = textwrap.dedent("""
    import torch
    from torch import nn
    from torch import optim


    class Model(nn.Module):
        def __init__(self, lr):
            super().__init__()
            self.a = nn.Linear(3, 4)
            self.norm = nn.LayerNorm(4)
            self.b = nn.Linear(4, 1)
            self.norm.weight.requires_grad_(False)
            self.double()
            self.optimizer = optim.Adam(
                PARAMS,
                lr,
            )

        def forward(self, x):
            return self.b(self.norm(self.a(x)))
""")


def _train(cls, steps: int = 4):
    torch.manual_seed(0)
    model = cls(1e-2)
    train_steps(model, model.optimizer, steps)
    return model


def test_an_optimizer_built_in_a_module_init_steps_the_same():
    code = AGENT.replace("PARAMS", "filter(lambda p: p.requires_grad, self.parameters())")
    findings, new = _rewrite(code)
    assert [(f.status, f.method) for f in findings] == [("rewritten", "__init__")], findings
    assert 'fused=all(p.device.type in ("cpu", "cuda") for p in self.parameters())' in new
    a, b = _train(_load(code)["Model"]), _train(_load(new)["Model"])
    assert b.optimizer.param_groups[0]["fused"] is True
    assert (
        len(b.optimizer.param_groups[0]["params"]) == len(a.optimizer.param_groups[0]["params"]) == 5
    )  # the frozen weight left out
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(y, x, rtol=1e-12, atol=1e-14)
    assert torch.equal(b.norm.weight, torch.ones(4, dtype=torch.float64))


def test_an_init_optimizer_over_parameters_passed_in_and_kept_is_not_rewritten():
    code = AGENT.replace("def __init__(self, lr)", "def __init__(self, lr, params=())").replace(
        "PARAMS", "params"
    )
    code = code.replace("        self.double()\n", "        self.double()\n        self.given = params\n")
    assert "self.given = params" in code
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["near-miss"], findings
    assert new == code


STD_OPT = textwrap.dedent("""
    import torch


    def get_std_opt(model_params, lr):
        base = torch.optim.Adam(model_params, lr=lr, betas=(0.9, 0.98), eps=1e-9)
        return base
""")


def _std_steps(get_std_opt, params_of, steps: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).double()
    opt = get_std_opt(params_of(model), 1e-2)
    train_steps(model, opt, steps)
    return model, opt


@pytest.mark.parametrize(
    ("given", "fused"),
    [
        (lambda m: m.parameters(), True),  # a one-shot generator: read once, by list()
        (lambda m: list(m.parameters()), True),
        # groups whose params are generators are not read (that would consume them): the default
        (lambda m: [{"params": (p for p in m[0].parameters())}, {"params": m[1].parameters()}], None),
        # ... and one such group is enough
        (lambda m: [{"params": list(m[0].parameters())}, {"params": m[1].parameters()}], None),
        # groups of lists are read
        (lambda m: [{"params": list(m[0].parameters())}, {"params": list(m[1].parameters()), "lr": 1e-3}], True),
    ],
)
def test_parameters_passed_in_are_materialized_once(given, fused: bool | None):
    findings, new = _rewrite(STD_OPT)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert "model_params := list(model_params)" in new
    model_a, opt_a = _std_steps(_load(STD_OPT)["get_std_opt"], given)
    model_b, opt_b = _std_steps(_load(new)["get_std_opt"], given)
    assert all(g["fused"] is fused for g in opt_b.param_groups)
    assert [len(g["params"]) for g in opt_b.param_groups] == [len(g["params"]) for g in opt_a.param_groups]
    assert sum(len(g["params"]) for g in opt_b.param_groups) == 4
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("line", "replacement"),
    [
        # read again after the optimizer: it would see the list instead of the spent generator
        ("return base", "return base, list(model_params)"),
        # read before (an iterator used twice)
        (
            "base = torch.optim.Adam(model_params, lr=lr, betas=(0.9, 0.98), eps=1e-9)",
            "first = next(iter(model_params))\nbase = torch.optim.Adam(model_params, lr=lr, betas=(0.9, 0.98), eps=1e-9)",
        ),
        # captured by a closure
        ("return base", "base.later = lambda: model_params\nreturn base"),
        # the call runs once per iteration (a generator: the second optimizer gets nothing)
        (
            "base = torch.optim.Adam(model_params, lr=lr, betas=(0.9, 0.98), eps=1e-9)",
            "for _ in range(2):\n    base = torch.optim.Adam(model_params, lr=lr)",
        ),
        # assigned again before the optimizer (another value than the one passed in)
        (
            "base = torch.optim.Adam(model_params, lr=lr, betas=(0.9, 0.98), eps=1e-9)",
            "model_params = filter(None, model_params)\nbase = torch.optim.Adam(model_params, lr=lr)",
        ),
    ],
)
def test_parameters_passed_in_and_read_elsewhere_are_not_rewritten(line: str, replacement: str):
    old = next(text for text in STD_OPT.splitlines(keepends=True) if text.strip() == line)
    indent = old[: len(old) - len(old.lstrip())]
    code = STD_OPT.replace(old, "".join(f"{indent}{part}\n" for part in replacement.split("\n")))
    findings, new = _rewrite(code)
    assert findings and all(f.status == "near-miss" for f in findings), findings
    assert new == code


def test_a_list_made_of_parameters_passed_in_does_not_look_into_groups():
    """`list(...)` of what was given: the items are read, a group among them whose `params` are
    not a list (maybe a generator, which reading would consume) leaves `fused` at its default."""
    code = STD_OPT.replace(
        "    base = torch.optim.Adam(model_params,",
        "    params = list(model_params)\n    base = torch.optim.Adam(params,",
    )
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert 'isinstance(g.get("params"), list)' in new and "or None" in new
    given = lambda m: [{"params": (p for p in m[0].parameters())}, {"params": m[1].parameters()}]  # noqa: E731
    model_a, opt_a = _std_steps(_load(code)["get_std_opt"], given)
    model_b, opt_b = _std_steps(_load(new)["get_std_opt"], given)
    assert [g["fused"] for g in opt_b.param_groups] == [None, None]
    assert (
        [len(g["params"]) for g in opt_b.param_groups]
        == [len(g["params"]) for g in opt_a.param_groups]
        == [2, 2]
    )
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


TRAINER = textwrap.dedent("""
    import torch
    from torch import optim


    class Trainer:
        def __init__(self, model, learner):
            self.model = model
            self.learner = learner

        def build_optimizer(self, **kwargs):
            params = kwargs.pop("params", self.model.parameters())
            learner = kwargs.pop("learner", self.learner)
            if learner == "adam":
                optimizer = optim.Adam(params, lr=1e-2, weight_decay=0.01)
            elif learner == "adamw":
                optimizer = optim.AdamW(params, lr=1e-2, weight_decay=0.01)
            elif learner == "sgd":
                optimizer = optim.SGD(params, lr=1e-2)
            else:
                optimizer = optim.Adam(params, lr=1e-2)
            return optimizer
""")


def _trainer_steps(code: str, learner: str, given, steps: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).double()
    trainer = _load(code)["Trainer"](model, learner)
    opt = trainer.build_optimizer(**({} if given is None else {"params": given(model)}))
    train_steps(model, opt, steps)
    return model, opt


@pytest.mark.parametrize(
    "given",
    [None, lambda m: m.parameters(), lambda m: (p for p in m[0].parameters()),
     lambda m: [{"params": list(m[0].parameters())}, {"params": list(m[1].parameters()), "lr": 1e-3}]],
)
@pytest.mark.parametrize("learner", ["adam", "adamw", "other"])
def test_a_local_assigned_before_the_call_is_materialized_once(learner: str, given):
    """recbole's `params = kwargs.pop("params", self.model.parameters())`: a local from elsewhere (a
    generator by default), read on other branches only, is materialized under its own name."""
    findings, new = _rewrite(TRAINER)
    assert [f.status for f in findings] == ["rewritten"] * 3, findings
    assert new.count("params := list(params)") == 3
    model_a, opt_a = _trainer_steps(TRAINER, learner, given)
    model_b, opt_b = _trainer_steps(new, learner, given)
    assert all(g["fused"] is True for g in opt_b.param_groups)
    assert [len(g["params"]) for g in opt_b.param_groups] == [len(g["params"]) for g in opt_a.param_groups]
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


_BRANCHES = TRAINER[TRAINER.index("        if learner"):TRAINER.index("        return optimizer")]


@pytest.mark.parametrize(
    "code",
    [
        # read on the optimizer's path before the call (an iterator used twice)
        TRAINER.replace("        if learner", "        self.count = len(list(params))\n        if learner"),
        # read after it
        TRAINER.replace("return optimizer", "return optimizer, params"),
        # the call runs in a loop: the second optimizer would get the list, not the spent generator
        TRAINER.replace(_BRANCHES, "        for _ in range(2):\n" + textwrap.indent(_BRANCHES, "    ")),
    ],
)
def test_a_local_read_on_the_optimizers_path_is_not_rewritten(code: str):
    assert code != TRAINER
    findings, new = _rewrite(code)
    assert len(findings) == 3 and all(f.status == "near-miss" for f in findings), findings
    assert new == code


GROUPS_HELPER = textwrap.dedent("""
    import torch


    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 4)
            self.b = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.b(self.a(x))

        def make_parameter_groups(self):
            no_decay = set(p for name, p in self.named_parameters() if name.endswith(".bias"))
            main = {"params": [p for p in self.parameters() if p not in no_decay]}
            return [main, {"params": GENERATED, "weight_decay": 0.0}]

        def make_default_optimizer(self):
            return torch.optim.AdamW(self.make_parameter_groups(), lr=1e-2, weight_decay=1e-2)
""")


@pytest.mark.parametrize(("generated", "fused"), [("list(no_decay)", True), ("iter(no_decay)", None)])
def test_groups_from_a_helper_are_materialized_under_a_free_name(generated: str, fused: bool | None):
    """rtdl's `torch.optim.AdamW(self.make_parameter_groups(), ...)`: the groups are read once into
    `params`; a group whose `params` are not a list (a one-shot iterator) is not looked into, and
    `fused` stays at its default."""
    code = GROUPS_HELPER.replace("GENERATED", generated)
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert "params := list(self.make_parameter_groups())" in new
    models, optimizers = [], []
    for source in (code, new):
        torch.manual_seed(0)
        model = _load(source)["Model"]().double()
        opt = model.make_default_optimizer()
        train_steps(model, opt, 4)
        models.append(model)
        optimizers.append(opt)
    assert [g["fused"] for g in optimizers[1].param_groups] == [fused, fused]
    assert [len(g["params"]) for g in optimizers[1].param_groups] == [2, 2]
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


SPELLED = textwrap.dedent("""
    import torch


    def make_optimizer(model, extra):
        return torch.optim.OPT(PARAMS, lr=1e-2)
""")


def _spelled_steps(code: str, given, steps: int = 4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)).double()
    opt = _load(code)["make_optimizer"](model, given(model))
    train_steps(model, opt, steps)
    return model, opt


# each spelling of the parameters as an expression at the call, and the device test it gets: the
# module's own `.parameters()` again (a selection of its tensors), or the expression held once by `:=`
@pytest.mark.parametrize(
    ("params", "written"),
    [
        ("list(model.parameters())", "for p in model.parameters())"),
        ("[*model.parameters()]", "for p in model.parameters())"),
        ("list(filter(lambda p: p.requires_grad, model.parameters()))", "for p in model.parameters())"),
        ("[p for n, p in model.named_parameters() if not n.endswith('bias')]", "for p in model.parameters())"),
        ("(p for _, p in model.named_parameters())", "for p in model.parameters())"),
        ("list(extra)", "params := list(extra),"),
        ("[*extra]", "params := [*extra],"),
        ("[p for p in extra]", "params := [p for p in extra],"),
        ("[p for p in extra if p.requires_grad]", "params := [p for p in extra if p.requires_grad],"),
        ("(p for p in extra)", "params := list(p for p in extra),"),
        ("list(filter(lambda p: p.requires_grad, extra))", "params := list(filter(lambda p: p.requires_grad, extra)),"),
        ("model[0].parameters()", "params := list(model[0].parameters()),"),
        ("[{'params': extra}, {'params': list(model[0].parameters()), 'lr': 1e-3}]",
         "params := [{'params': extra}, {'params': list(model[0].parameters()), 'lr': 1e-3}],"),
    ],
)
@pytest.mark.parametrize("extra_listed", [False, True])  # `extra`: a one-shot generator, or a list
@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_parameters_written_as_an_expression_step_the_same(params: str, written: str, extra_listed: bool, cls: str):
    """The parameters spelled as an expression at the call: the device test reads only names the
    rewritten function binds (none the analysis made up for a part of the expression), steps as
    the original does, and a second scan finds the rewrite in its final form."""
    code = SPELLED.replace("OPT", cls).replace("PARAMS", params)
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert written in new, new
    given = (lambda m: list(m[1].parameters())) if extra_listed else (lambda m: m[1].parameters())
    model_a, opt_a = _spelled_steps(code, given)
    model_b, opt_b = _spelled_steps(new, given)
    assert [len(g["params"]) for g in opt_b.param_groups] == [len(g["params"]) for g in opt_a.param_groups]
    # a group whose `params` are a generator is not looked into (reading would consume it): the default
    fused = None if "{'params': extra}" in params and not extra_listed else True
    assert [g["fused"] for g in opt_b.param_groups] == [fused] * len(opt_b.param_groups)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
    assert _rewrite(new)[1] == new


def test_a_local_from_a_submodule_expression_is_materialized():
    """`params = model[0].parameters()`: the module is an expression (indexing may run any code),
    so the generator is materialized once under its own name instead of being read again."""
    code = SPELLED.replace("    return torch.optim.OPT(PARAMS,", "    params = model[0].parameters()\n"
                           "    return torch.optim.Adam(params,")
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert "params := list(params)," in new
    model_a, opt_a = _spelled_steps(code, list)
    model_b, opt_b = _spelled_steps(new, list)
    assert [g["fused"] for g in opt_b.param_groups] == [True]
    assert len(opt_b.param_groups[0]["params"]) == len(opt_a.param_groups[0]["params"]) == 2
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(
    ("params", "written"),
    [
        # new tensors made from each pair's tensor: not the module's own
        ("[p.detach() for n, p in model.named_parameters()]", "params := [p.detach() for n, p in model.named_parameters()],"),
        # the module is a subscript, which may run any code: not called again
        ("filter(lambda p: p.dim() > 1, model[0].parameters())",
         "params := list(filter(lambda p: p.dim() > 1, model[0].parameters())),"),
    ],
)
def test_expressions_not_a_selection_of_a_modules_parameters_are_materialized(params: str, written: str):
    code = SPELLED.replace("OPT", "AdamW").replace("PARAMS", params)
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert written in new and "model.parameters())" not in new.split("fused=")[1], new
    model_a, opt_a = _spelled_steps(code, list)
    model_b, opt_b = _spelled_steps(new, list)
    assert [g["fused"] for g in opt_b.param_groups] == [True]
    assert len(opt_b.param_groups[0]["params"]) == len(opt_a.param_groups[0]["params"])
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


# a tensor held twice in one group (`extra` overlapping the module's parameters, weights tied
# between two lists): the default implementation updates it twice in turn, the fused kernel once,
# so `fused` keeps its default there; a tensor in two groups raises either way
@pytest.mark.parametrize(
    ("params", "given", "fused"),
    [
        ("list(model.parameters()) + list(extra)", lambda m: list(m[1].parameters()), None),
        ("list(model.parameters()) + list(extra)", lambda m: [], True),
        ("[*model[0].parameters(), *extra]", lambda m: list(m[0].parameters()), None),
        ("[*model[0].parameters(), *extra]", lambda m: list(m[1].parameters()), True),
        ("[{'params': list(model.parameters()) + list(extra)}]", lambda m: [m[0].weight], None),
        ("[{'params': list(model[0].parameters())}, {'params': list(extra)}]", lambda m: list(m[1].parameters()), True),
        ("extra", lambda m: [m[0].weight, m[1].weight, m[0].weight], None),
        ("extra", lambda m: (p for p in [m[0].weight, m[1].weight, m[0].weight]), None),
    ],
)
def test_a_tensor_held_twice_keeps_the_default_implementation(params: str, given, fused: bool | None):
    code = SPELLED.replace("OPT", "AdamW").replace("PARAMS", params)
    findings, new = _rewrite(code)
    assert [f.status for f in findings] == ["rewritten"], findings
    assert "len({id(p)" in "".join(new.split()), new
    # torch itself warns of the duplicate (both builds): the case is the one meant
    with pytest.warns(UserWarning, match="duplicate") if fused is None else contextlib.nullcontext():
        model_a, opt_a = _spelled_steps(code, given)
        model_b, opt_b = _spelled_steps(new, given)
    assert [g["fused"] for g in opt_b.param_groups] == [fused] * len(opt_b.param_groups)
    for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)
    assert _rewrite(new)[1] == new


def test_a_modules_own_parameters_need_no_test_of_distinct_tensors():
    """`.parameters()` lists each tensor of the module once (tied weights too), and so does any
    selection of it: the rewrite reads only their devices."""
    for params in ("model.parameters()", "filter(lambda p: p.requires_grad, model.parameters())",
                   "[p for n, p in model.named_parameters() if 'bias' not in n]"):
        findings, new = _rewrite(SPELLED.replace("OPT", "AdamW").replace("PARAMS", params))
        assert [f.status for f in findings] == ["rewritten"], findings
        assert "for p in model.parameters())" in new and "id(p)" not in new, new
